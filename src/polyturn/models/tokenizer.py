"""Train small byte-level BPE tokenizers on environment text.

Both the tiny from-scratch actor and the from-scratch critic read the
environment's text with a tokenizer trained here, so that a 2,048-token
vocabulary spends its merges on SQL, table names and tool syntax rather than
on general English.

Design choices, each for a reason:

* **Byte-level**: every unicode string (Chinese included) encodes with no
  unknown token and decodes back to exactly the same string, so rollouts are
  lossless token-in / token-out.
* **Digits one by one**: numbers are split into single digits before BPE, so a
  model copies ``12345`` digit by digit instead of memorising number chunks.
* **Special tokens**: ``<|pad|>`` is always added (id 0). Any further
  ``special_tokens`` (for example ``<|im_start|>``) are added as special
  tokens right after it, in the order given: they never split, never merge
  with neighbouring text, and ``decode(..., skip_special_tokens=True)`` drops
  them. No BOS/EOS/UNK role is assigned; a caller that needs one sets it, e.g.
  ``tok.eos_token = "<|im_end|>"`` (the token must be among ``special_tokens``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"

__all__ = ["PAD_TOKEN", "train_tokenizer"]


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 2048,
    special_tokens: Sequence[str] = (),
    min_frequency: int = 2,
    model_max_length: int = 4096,
    split_digits: bool = True,
    split_words: bool = True,
    max_token_length: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it for ``transformers``.

    Args:
        texts: the training corpus, one string per document (any iterable,
            consumed once).
        vocab_size: the total vocabulary size, special tokens and the 256 byte
            symbols included. Must exceed ``256 + 1 + len(special_tokens)``.
        special_tokens: extra special tokens, added after ``<|pad|>``.
        min_frequency: a pair must occur this often to be merged.
        model_max_length: stored on the tokenizer, used by ``truncation=True``.
        split_digits: split numbers into single digits before BPE (see the module docstring).
            ``False`` lets frequent numbers (years, small counts) become single tokens.
        split_words: pre-split text into words (the usual byte-level BPE). ``False`` lets merges
            cross spaces and punctuation ("phrase BPE"), so the frequent phrases of an environment
            (``FROM sales WHERE zone = '``) and multi-word names (``East China``) become single
            tokens; implies no digit splitting.
        max_token_length: longest token in characters (None: unlimited).

    Returns:
        A ``PreTrainedTokenizerFast`` with ``pad_token="<|pad|>"`` (id 0).
        Save it with ``save_pretrained(dir)`` and load it back with
        ``AutoTokenizer.from_pretrained(dir)``. Training is deterministic:
        the same corpus and arguments give the same vocabulary and merges.

    Example:
        >>> tok = train_tokenizer(["SELECT name FROM users WHERE id = 42"] * 4, vocab_size=300)
        >>> tok.decode(tok("id = 1234")["input_ids"])
        'id = 1234'
    """
    specials = [PAD_TOKEN, *(t for t in special_tokens if t != PAD_TOKEN)]
    if len(set(specials)) != len(specials):
        raise ValueError(f"Expected distinct special tokens, got {list(special_tokens)}")
    if any(not t for t in specials):
        raise ValueError(f"Expected non-empty special tokens, got {list(special_tokens)}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    min_vocab = len(alphabet) + len(specials) + 1
    if vocab_size < min_vocab:
        raise ValueError(
            f"Expected vocab_size >= {min_vocab} (256 bytes + {len(specials)} special tokens + 1 merge), "
            f"got {vocab_size}"
        )
    if min_frequency < 1:
        raise ValueError(f"Expected min_frequency >= 1, got {min_frequency}")

    tok = Tokenizer(models.BPE())
    # No normalizer: normalising (NFKC, lower-casing) would break exact round trips.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_words)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits and split_words
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        # The full byte alphabet makes every string encodable even when the
        # corpus never shows some bytes (e.g. a Chinese question on an English corpus).
        initial_alphabet=alphabet,
        show_progress=False,
        max_token_length=max_token_length,
    )
    tok.train_from_iterator(texts, trainer=trainer)

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        extra_special_tokens=specials[1:],
        model_max_length=model_max_length,
        # Clean-up rewrites " ." to "." and would break exact decoding; transformers 5 skips it
        # for BPE anyway, but says so in a warning on every decode unless it is off.
        clean_up_tokenization_spaces=False,
    )
