"""Masked reductions used by every loss.

A mask is a bool tensor or a 0/1 tensor of any dtype; positions where it is 0
contribute nothing to a value or its gradient, even when they hold NaN or inf.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from polyturn.algos._validate import as_bool_mask, check_float

Agg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
"""How a per-token loss ``[B, L]`` becomes a scalar.

* ``token_mean``: sum over all masked tokens of the batch / their count
  (every token weighs the same; long sequences weigh more).
* ``seq_mean_token_mean``: mean over each sequence's masked tokens, then mean
  over sequences that have at least one (every sequence weighs the same).
* ``seq_mean_token_sum``: sum over each sequence's masked tokens, then mean
  over sequences that have at least one.
"""

AGG_MODES: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1.

    Args:
        x: floating tensor, any shape.
        mask: bool or 0/1 tensor, same shape as ``x``.
        dim: reduce only this dimension; ``None`` reduces all.

    Returns:
        A scalar (or ``x`` without ``dim``). Where no position is selected the
        result is 0, not NaN.
    """
    x = check_float("x", x)
    m = as_bool_mask("mask", mask, x.shape, "x")
    total = torch.where(m, x, 0.0).sum() if dim is None else torch.where(m, x, 0.0).sum(dim)
    count = m.sum() if dim is None else m.sum(dim)
    return total / count.clamp(min=1).to(x.dtype)


def aggregate(x: Tensor, mask: Tensor, agg: Agg = "token_mean") -> Tensor:
    """Reduce a per-token quantity ``x [B, L]`` to a scalar as ``agg`` says.

    Args:
        x: floating tensor ``[B, L]`` (``token_mean`` accepts any shape).
        mask: bool or 0/1 tensor ``[B, L]``; 1 on the tokens that count.
        agg: one of :data:`Agg`.

    Returns:
        A scalar; 0 when the mask selects nothing.
    """
    x = check_float("x", x)
    m = as_bool_mask("mask", mask, x.shape, "x")
    if agg == "token_mean":
        return masked_mean(x, m)
    if agg not in AGG_MODES:
        raise ValueError(f"Expected agg to be one of {AGG_MODES}, got {agg!r}")
    if x.ndim != 2:
        raise ValueError(f"Expected x of shape [B, L] for agg={agg!r}, got {tuple(x.shape)}")
    per_seq = torch.where(m, x, 0.0).sum(1)
    count = m.sum(1)
    if agg == "seq_mean_token_mean":
        per_seq = per_seq / count.clamp(min=1).to(x.dtype)
    return masked_mean(per_seq, count > 0)
