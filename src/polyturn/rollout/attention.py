"""Decode-step attention for the rollout engine's per-row KV cache.

One new token per row reads every column of its row: a matrix-vector product per head, bound by how fast the
keys and values stream from memory. On the CPU, ``scaled_dot_product_attention`` with a boolean mask read
those columns at about two thirds of the rate that two batched matrix products and a softmax do (64 rows,
4 heads of 32, 500 columns: 2.25 vs 1.54 ms), and under grouped-query attention transformers first repeats
each key/value head for every query head that shares it. :func:`row_attention` reads each key/value head
once: the query heads that share it are stacked as rows of one product. Blocks of several new tokens
(prefills) go to transformers' SDPA path unchanged.

:class:`BatchDecoder` switches a model to it only for its own forward passes (:func:`decode_attention`);
training forward passes keep the model's own attention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "polyturn_rows"


def row_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query`` ``[B, H, n, D]``, ``key``/``value`` ``[B, Hkv, W, D]``,
    a boolean ``attention_mask`` ``[B, 1, n, W]`` (True = attend); returns ``([B, n, H, D], None)``."""
    b, h, n, d = query.shape
    if n != 1 or dropout or attention_mask is None or attention_mask.dtype != torch.bool:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    hk, w = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else d ** -0.5
    q = query.reshape(b, hk, h // hk, d)  # query head j reads key/value head j // (h // hk), as repeat_kv does
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # [B, Hkv, G, W]
    scores = scores.masked_fill(~attention_mask.reshape(b, 1, 1, w), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, Hkv, G, D]
    return out.reshape(b, 1, h, d), None


AttentionInterface.register(NAME, row_attention)


@contextlib.contextmanager
def decode_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model``'s attention through :func:`row_attention` inside the block (restored after, on error too).

    Only models whose attention dispatches through transformers' ``AttentionInterface`` with SDPA (Llama,
    Qwen2, SmolLM2, ...) switch; others (eager attention, or custom modules) run unchanged.
    """
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
