"""Tests for polyturn.models.tokenizer.train_tokenizer."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from polyturn.models.tokenizer import PAD_TOKEN, train_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SPECIALS = ("<|im_start|>", "<|im_end|>")


def _corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["SELECT", "FROM", "WHERE", "orders", "amount", "users", "查询", "订单", "金额", "Action:", "2024"]
    return [" ".join(rng.choice(words) for _ in range(30)) + f" id = {rng.randint(0, 99999)}" for _ in range(n)]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(_corpus(), vocab_size=512, special_tokens=SPECIALS)


def test_learns_merges_and_pad_is_id_zero(tok):
    assert tok.pad_token == PAD_TOKEN and tok.pad_token_id == 0
    # Frequent words become single tokens: the tokenizer did learn merges.
    assert len(tok("SELECT")["input_ids"]) == 1
    assert 256 + 3 < len(tok) <= 512


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_unicode(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert all(0 <= i < len(tok) for i in ids)
    assert tok.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=60))
def test_round_trip_chinese(tok, text):
    assert tok.decode(tok(text)["input_ids"]) == text


def test_round_trip_whitespace_and_punctuation(tok):
    # transformers' default clean-up would turn " ." into "." here.
    text = "用户问：订单 12 的金额？ SELECT a , b . \n\t  x  ; é"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_digits_are_split_even_when_frequent(tok):
    # "2024" appears thousands of times in the corpus, so plain BPE would merge it.
    tokens = tok.convert_ids_to_tokens(tok("in 2024 we sold 31337 items")["input_ids"])
    digit_tokens = [t for t in tokens if any(c.isdigit() for c in t)]
    assert digit_tokens == list("2024") + list("31337")


def test_special_tokens_are_atomic_and_skippable(tok):
    text = "<|im_start|>user hi<|im_end|>"
    ids = tok(text)["input_ids"]
    start, end = tok.convert_tokens_to_ids(list(SPECIALS))
    assert ids[0] == start and ids[-1] == end
    assert set(SPECIALS) <= set(tok.all_special_tokens)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user hi"
    assert tok.convert_tokens_to_ids(PAD_TOKEN) == 0


def test_deterministic():
    a = train_tokenizer(_corpus(), vocab_size=512, special_tokens=SPECIALS)
    b = train_tokenizer(_corpus(), vocab_size=512, special_tokens=SPECIALS)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_save_and_load(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "<|im_start|>SELECT 查询 FROM orders WHERE id = 77<|im_end|> ."
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.decode(tok(text)["input_ids"]) == text
    assert loaded.pad_token == PAD_TOKEN and loaded.pad_token_id == 0
    assert loaded.model_max_length == tok.model_max_length == 4096
    assert set(SPECIALS) <= set(loaded.all_special_tokens)


def test_padding_uses_pad_token(tok):
    batch = tok(["SELECT", "SELECT a FROM b"], padding=True)
    assert batch["input_ids"][0][-1] == 0 and batch["attention_mask"][0][-1] == 0


def test_rejects_too_small_vocab():
    with pytest.raises(ValueError, match="Expected vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


def test_rejects_duplicate_special_tokens():
    with pytest.raises(ValueError, match="Expected distinct"):
        train_tokenizer(["abc"], special_tokens=["<|a|>", "<|a|>"])


@pytest.mark.slow
def test_trains_on_a_megabyte():
    # Its speed is measured by benchmarks/tokenizer.py: a wall-clock limit here would flake on a shared machine.
    texts = _corpus(n=6000, seed=1)
    assert sum(len(t.encode()) for t in texts) > 1_000_000
    tok = train_tokenizer(texts, vocab_size=2048)
    assert tok.decode(tok(texts[0])["input_ids"]) == texts[0]


def test_phrase_bpe_merges_across_words_and_round_trips():
    corpus = ["SELECT SUM(units) FROM sales WHERE zone = 'East China'"] * 50 + ["Top products in East China?"] * 50
    word = train_tokenizer(corpus, vocab_size=400)
    phrase = train_tokenizer(corpus, vocab_size=400, split_words=False, max_token_length=24)
    text = "SELECT SUM(units) FROM sales WHERE zone = 'East China'"
    assert len(phrase.encode(text)) < len(word.encode(text)) / 2
    assert all(len(t) <= 24 for t in phrase.convert_ids_to_tokens(phrase.encode(text)))
    for s in [text, "新的问题 2024-Q3 ?", "", "  two  spaces\n\ttab"]:
        assert phrase.decode(phrase.encode(s)) == s
