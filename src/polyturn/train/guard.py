"""One optimizer step that refuses non-finite losses and gradients (and scales them under fp16)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Literal

import torch

from polyturn.train import distributed

StepOutcome = Literal["ok", "nonfinite_loss", "nonfinite_grad", "fp16_overflow", "declined"]


def guarded_step(loss: torch.Tensor | Iterable[torch.Tensor], opts: list[torch.optim.Optimizer], params: list,
                 max_norm: float, *, scaler: torch.amp.GradScaler | None = None,
                 proceed: Callable[[], bool] | None = None) -> tuple[StepOutcome, float]:
    """Backward, clip and step ``opts``, unless the loss or the gradient is non-finite; returns the outcome
    and the gradient norm before clipping.

    ``loss`` may be an iterable of parts (micro-batch losses) whose gradients add up to the step's: each is
    backpropagated before the next is drawn, so one part's activations are alive at a time. With a
    ``scaler`` (fp16) the loss is scaled, and an overflowing gradient lowers the scale and skips the step
    (``fp16_overflow``), as fp16 training expects, rather than counting as a fault. A refused step leaves
    every gradient cleared and no weight changed. ``proceed``, asked once every part is backpropagated (the
    statistics of the loss pass are known by then), can decline the step (``declined``; PPO's KL limit).
    """
    for o in opts:
        o.zero_grad(set_to_none=True)
    nonfinite = False
    for part in [loss] if isinstance(loss, torch.Tensor) else loss:
        if not torch.isfinite(part):
            nonfinite = True
            break
        (part if scaler is None else scaler.scale(part)).backward()
    if distributed.any_rank(nonfinite):  # under torchrun: every process refuses the step together
        for o in opts:
            o.zero_grad(set_to_none=True)
        return "nonfinite_loss", float("nan")
    # Under torchrun each process backpropagated its share of the micro-batches: add the others' (no-op alone).
    distributed.sum_gradients(p for o in opts for g in o.param_groups for p in g["params"])
    if proceed is not None and not proceed():
        for o in opts:
            o.zero_grad(set_to_none=True)
        return "declined", float("nan")
    if scaler is not None:
        for o in opts:
            scaler.unscale_(o)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if not math.isfinite(norm):
        for o in opts:
            o.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.update()
            return "fp16_overflow", norm
        return "nonfinite_grad", norm
    for o in opts:
        if scaler is None:
            o.step()
        else:
            scaler.step(o)
    if scaler is not None:
        scaler.update()
    return "ok", norm
