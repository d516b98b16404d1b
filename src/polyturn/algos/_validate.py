"""Argument checks shared by the algos functions.

Every error reads "Expected X, got Y" so that a caller sees both what the
function needs and what it received.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def check_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"Expected {name} to be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(name: str, x: object, *, ndim: int | None = None) -> Tensor:
    x = check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"Expected {name} to be a floating-point tensor, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(
            f"Expected {name} to have {ndim} dimensions, got shape {tuple(x.shape)}"
        )
    return x


def check_shape(name: str, x: Tensor, shape: Sequence[int], like: str) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"Expected {name} to have shape {tuple(shape)} like {like}, got {tuple(x.shape)}"
        )


def check_like(name: str, x: object, ref_name: str, ref: Tensor) -> Tensor:
    """A floating tensor with the shape and dtype of ``ref``."""
    x = check_float(name, x)
    check_shape(name, x, ref.shape, ref_name)
    if x.dtype != ref.dtype:
        raise TypeError(f"Expected {name} to have dtype {ref.dtype} like {ref_name}, got {x.dtype}")
    return x


def as_bool_mask(name: str, mask: object, shape: Sequence[int], like: str) -> Tensor:
    """A 0/1 tensor of any dtype (or bool) with the given shape, as bool."""
    mask = check_tensor(name, mask)
    check_shape(name, mask, shape, like)
    if mask.dtype == torch.bool:
        return mask
    if not ((mask == 0) | (mask == 1)).all():
        raise ValueError(f"Expected {name} to hold only 0 and 1, got other values")
    return mask != 0


def check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Expected {name} in [0, 1], got {value}")


def check_positive(name: str, value: float) -> None:
    if not value > 0.0:
        raise ValueError(f"Expected {name} > 0, got {value}")


def per_row_rate(name: str, value: float | Tensor, rows: int, like: Tensor) -> float | Tensor:
    """A float in [0, 1], or a tensor ``[rows]`` in [0, 1] returned as ``[rows, 1]``."""
    if isinstance(value, Tensor):
        if value.shape != (rows,):
            raise ValueError(
                f"Expected {name} to be a float or a tensor of shape ({rows},), "
                f"got shape {tuple(value.shape)}"
            )
        if not ((value >= 0) & (value <= 1)).all():
            raise ValueError(f"Expected every {name} in [0, 1], got {value.tolist()}")
        return value.to(dtype=like.dtype, device=like.device).unsqueeze(1)
    check_unit_interval(name, float(value))
    return float(value)
