"""Decode-step attention for the rollout engine's per-row KV cache.

One new token per row reads every column of its row: a matrix-vector product per head, bound by how fast the
keys and values stream from memory. On the CPU, ``scaled_dot_product_attention`` with a boolean mask read
those columns at about two thirds of the rate that two batched matrix products and a softmax do (64 rows,
4 heads of 32, 500 columns: 2.25 vs 1.54 ms). :func:`row_attention` does the latter; under grouped-query
attention the query heads that share a key/value head are stacked as rows of one product (as transformers'
``pack_gqa`` does for SDPA), so each key/value head is read once. Blocks of several new tokens (prefills) go
to SDPA, under grouped-query attention with their queries folded the same way (the g query heads of a
key/value head as one head of g * n queries), where transformers' path would first copy each key/value head
g times.

When every row of a decode step opens with the same prefix (the tool docs in a system prompt, copied into
each row's first columns), the decoder passes that prefix's keys and values (:class:`SharedPrefix`): the
step then reads them once for all rows, as one product whose rows are every row's query heads (cascade
attention, as FlashInfer names it), and each row's own columns after them as before. The softmax runs over
both parts together, so the result is the same attention. The cache then hands over only the rows' own columns
(``SharedPrefix.sliced``): a step that runs a subset of the rows gathers those columns alone, contiguous, instead
of every column and then a copy of the own ones (a SmolLM2 decode step of 4-24 of 48 rows after a 702-token
prefix, bf16: 1.13-1.34x; ``benchmarks/subset_steps.py``).

:class:`BatchDecoder` switches a model to it only for its own forward passes (:func:`decode_attention`);
training forward passes keep the model's own attention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "polyturn_rows"


@dataclass(frozen=True)
class SharedPrefix:
    """Keys and values ``[1, Hkv, P, D]`` per layer of a prefix every row of the step holds in columns 0..P-1.

    ``sliced``: the step's keys and values (what the cache returns) hold only the columns after the prefix, the
    attention mask still every column."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    sliced: bool = False

    @property
    def length(self) -> int:
        return self.kv[0][0].shape[2]


_SHARED: ContextVar[SharedPrefix | None] = ContextVar("polyturn_shared_prefix", default=None)


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
    shared = _SHARED.get()
    layer = getattr(module, "layer_idx", None)
    cascade = (shared is not None and layer is not None and layer < len(shared.kv) and n == 1 and not dropout
               and attention_mask is not None and attention_mask.dtype == torch.bool
               and shared.length < attention_mask.shape[-1])
    if shared is not None and shared.sliced and not cascade:  # the prefix's columns put back in front
        key, value = (torch.cat([p.to(x.dtype).expand(x.shape[0], -1, -1, -1), x], dim=2)
                      for p, x in zip(shared.kv[layer], (key, value)))
    if dropout or attention_mask is None or attention_mask.dtype != torch.bool:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    hk, w = key.shape[1], attention_mask.shape[-1]
    g = h // hk
    scale = scaling if scaling is not None else d ** -0.5
    if n != 1:
        if g == 1 or attention_mask.shape[1] != 1:
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        # A block under grouped-query attention: the query heads sharing a key/value head become one head of
        # g * n queries, so SDPA reads each key/value head once (transformers' path copies them g times first).
        q = query.reshape(b, hk, g * n, d)
        mb = attention_mask.shape[0]
        mask = attention_mask[:, :, None].expand(mb, 1, g, n, w).reshape(mb, 1, g * n, w)
        out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
        return out.reshape(b, h, n, d).transpose(1, 2).contiguous(), None
    q = query.reshape(b, hk, g, d)  # query head j reads key/value head j // g, as repeat_kv does
    mask = attention_mask.reshape(b, 1, 1, w)
    if not cascade:
        scores = torch.matmul(q, _dense(key).transpose(-1, -2)).float() * scale  # [B, Hkv, G, W]
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(value.dtype)
        return torch.matmul(probs, value).reshape(b, 1, h, d), None
    # Cascade: the shared prefix's columns once for every row (a [Hkv, B*G, P] product), then each row's own.
    pk, pv = shared.kv[layer]
    p = shared.length
    q_rows = q.transpose(0, 1).reshape(hk, b * g, d)  # [Hkv, B*G, D]
    s_prefix = torch.matmul(q_rows, pk[0].transpose(-1, -2)).reshape(hk, b, g, p).transpose(0, 1)  # [B, Hkv, G, P]
    own_k, own_v = (key, value) if shared.sliced else (key[:, :, p:], value[:, :, p:])
    s_own = torch.matmul(q, _dense(own_k).transpose(-1, -2)).masked_fill(~mask[..., p:], float("-inf"))
    probs = torch.softmax(torch.cat([s_prefix, s_own], dim=-1).float() * scale, dim=-1).to(value.dtype)
    out = torch.matmul(probs[..., p:], own_v)  # [B, Hkv, G, D]
    p_rows = probs[..., :p].transpose(0, 1).reshape(hk, b * g, p)
    out = out + torch.matmul(p_rows, pv[0]).reshape(hk, b, g, d).transpose(0, 1)
    return out.reshape(b, 1, h, d), None


def _dense(key: torch.Tensor) -> torch.Tensor:
    """``key`` as a contiguous tensor when it is bf16/fp16 on the CPU.

    The cache's keys are a view of the first columns of a wider buffer. On the CPU a bf16 product with such a
    view (its rows a buffer's width apart) ran ~4x slower than copying it contiguous first and multiplying
    (SmolLM2's decode shape, 64 rows, 458 of 596 columns: 5.2 against 1.4 ms per layer, the copy included;
    docs/rollout-speed.md); float32 products read the view at full speed, and CUDA's batched products take
    any batch stride.
    """
    if key.dtype == torch.float32 or key.device.type != "cpu" or key.is_contiguous():
        return key
    return key.contiguous()


AttentionInterface.register(NAME, row_attention)


@contextlib.contextmanager
def decode_attention(model: torch.nn.Module, shared: SharedPrefix | None = None) -> Iterator[None]:
    """Run ``model``'s attention through :func:`row_attention` inside the block (restored after, on error too).

    ``shared``: a prefix every row of the block's decode steps holds in its first columns (read once).
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
        with shared_prefix(shared):
            yield
    finally:
        config._attn_implementation = before


@contextlib.contextmanager
def shared_prefix(shared: SharedPrefix | None) -> Iterator[None]:
    """:func:`row_attention` calls inside the block read ``shared`` (see :func:`decode_attention`)."""
    token = _SHARED.set(shared)
    try:
        yield
    finally:
        _SHARED.reset(token)
