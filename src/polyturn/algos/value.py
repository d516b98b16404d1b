"""Critic training: value loss, TD targets, target-network averaging, CQL penalty.

The critic is trained on-policy against GAE returns (:func:`value_loss`) or
off-policy against one-step targets from a slowly moving target network
(:func:`td_targets` + :func:`polyak_update`). :func:`cql_penalty` is the
conservative term for offline data (CQL, discrete candidate actions).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from polyturn.algos._validate import (
    as_bool_mask,
    check_float,
    check_like,
    check_positive,
    check_shape,
    check_unit_interval,
)
from polyturn.algos.masked import masked_mean

#: Explained variance divides by Var[target]; below these it is ill-conditioned and reported as NaN: targets whose
#: standard deviation is under 1% of their mean's size (Var < EV_MIN_REL_VAR x mean^2) are nearly constant, so a
#: critic off by a few percent of the returns' size scores -100s (diagnose once printed -355 for such returns);
#: EV_MIN_VAR covers targets that are all about 0, where the relative test cannot bite.
EV_MIN_REL_VAR = 1e-4
EV_MIN_VAR = 1e-8


def ev_ill_conditioned(var: float, mean: float) -> bool:
    """Whether targets of variance ``var`` and mean ``mean`` are too nearly constant for explained variance.

    >>> ev_ill_conditioned(2.5e-5, -5.0), ev_ill_conditioned(0.3, -5.0), ev_ill_conditioned(1e-9, 0.0)
    (True, False, True)
    """
    return not var >= max(EV_MIN_VAR, EV_MIN_REL_VAR * mean * mean)


def explained_variance(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[target - pred] / Var[target]`` over masked entries (no grad).

    1 is a perfect critic, 0 one no better than predicting the mean, negative
    worse than that. NaN when the masked targets are nearly constant
    (:func:`ev_ill_conditioned`: the ratio would measure the critic's error
    against a spread of ~0, not how much of the returns it explains).

    Args:
        pred: float tensor, any shape (e.g. values ``[E, T]``).
        target: float tensor, same shape and dtype (e.g. returns).
        mask: bool or 0/1 tensor, same shape; entries that count.

    Returns:
        A scalar tensor.
    """
    pred = check_float("pred", pred)
    target = check_like("target", target, "pred", pred)
    m = as_bool_mask("mask", mask, pred.shape, "pred")
    with torch.no_grad():
        def var(x: Tensor) -> Tensor:
            return masked_mean((x - masked_mean(x, m)) ** 2, m)

        var_target, mean = var(target), masked_mean(target, m)
        floor = torch.clamp(EV_MIN_REL_VAR * mean * mean, min=EV_MIN_VAR)
        return torch.where(var_target >= floor, 1.0 - var(target - pred) / var_target, torch.nan)


def value_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    old_values: Tensor | None = None,
    clip_range: float | None = None,
) -> dict[str, Tensor]:
    """Half mean squared error between critic values and return targets.

    With ``clip_range`` (PPO-style value clipping), the prediction may move at
    most ``clip_range`` from ``old_values`` before the error stops shrinking::

        v_clip = old_values + clamp(values - old_values, -clip_range, clip_range)
        loss   = 0.5 * mean(max((values - returns)^2, (v_clip - returns)^2))

    Args:
        values: float tensor, any shape (``[E, T]`` per turn or ``[N]``),
            the critic's predictions (differentiable).
        returns: same shape and dtype; targets (GAE returns or TD targets).
            Treated as constants: no gradient flows into them.
        mask: bool or 0/1, same shape; 1 on real entries (turns), 0 on padding.
        old_values: same shape and dtype; the values at collection time,
            required with ``clip_range``.
        clip_range: > 0, or ``None`` for no clipping.

    Returns:
        ``loss`` (differentiable), ``explained_variance``, ``value_mean``,
        ``return_mean`` and, with clipping, ``clipfrac`` (fraction of entries
        whose value moved more than ``clip_range``); diagnostics carry no grad.
    """
    values = check_float("values", values)
    returns = check_like("returns", returns, "values", values).detach()
    m = as_bool_mask("mask", mask, values.shape, "values")
    if (old_values is None) != (clip_range is None):
        raise ValueError(
            "Expected old_values and clip_range together (both or neither), got "
            f"old_values={'a tensor' if old_values is not None else None}, clip_range={clip_range}"
        )
    sq = (torch.where(m, values, 0.0) - torch.where(m, returns, 0.0)) ** 2
    out: dict[str, Tensor] = {}
    if old_values is not None and clip_range is not None:
        old = check_like("old_values", old_values, "values", values).detach()
        check_positive("clip_range", clip_range)
        step = torch.where(m, values - old, 0.0)
        clipped = torch.where(m, old, 0.0) + step.clamp(-clip_range, clip_range)
        sq = torch.maximum(sq, (clipped - torch.where(m, returns, 0.0)) ** 2)
        with torch.no_grad():
            out["clipfrac"] = masked_mean((step.abs() > clip_range).to(values.dtype), m)
    loss = 0.5 * masked_mean(sq, m)
    with torch.no_grad():
        out["explained_variance"] = explained_variance(values.detach(), returns, m)
        out["value_mean"] = masked_mean(values.detach(), m)
        out["return_mean"] = masked_mean(returns, m)
    return {"loss": loss, **out}


def td_targets(
    rewards: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    *,
    gamma: float | Tensor,
) -> Tensor:
    """One-step targets ``r + gamma * (1 - terminated) * V_target(s')`` (no grad).

    A truncated transition (time limit) still bootstraps; only ``terminated``
    drops the next state's value.

    Args:
        rewards: float tensor, any shape (``[N]`` transitions or ``[E, T]``).
        next_values: same shape and dtype; the target network's ``V(s')``.
        terminated: bool or 0/1, same shape.
        gamma: in [0, 1]; a float or a tensor of shape ``[rewards.shape[0]]``.

    Returns:
        A detached tensor with the shape of ``rewards``.
    """
    rewards = check_float("rewards", rewards)
    next_values = check_like("next_values", next_values, "rewards", rewards)
    term = as_bool_mask("terminated", terminated, rewards.shape, "rewards")
    if isinstance(gamma, Tensor):
        if rewards.ndim == 0:
            raise ValueError("Expected a float gamma for 0-dimensional rewards, got a tensor")
        check_shape("gamma", gamma, rewards.shape[:1], "rewards' first dimension")
        if not ((gamma >= 0) & (gamma <= 1)).all():
            raise ValueError(f"Expected every gamma in [0, 1], got {gamma.tolist()}")
        gamma = gamma.to(rewards.dtype).reshape(-1, *([1] * (rewards.ndim - 1)))
    else:
        check_unit_interval("gamma", float(gamma))
    with torch.no_grad():
        bootstrap = torch.where(term, 0.0, next_values)
        return rewards + gamma * bootstrap


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Move ``target`` toward ``source`` in place: ``p_t <- (1 - tau) p_t + tau p_s``.

    Applies to every parameter and floating-point buffer; other buffers
    (e.g. counters) are copied. ``tau=0`` leaves ``target`` unchanged,
    ``tau=1`` makes it an exact copy. The only function in ``algos`` that
    mutates an argument: ``target`` is meant to be owned by the trainer.

    Args:
        target: the target network (modified in place).
        source: the online network; must have the same parameter names and shapes.
        tau: in [0, 1]; the usual value is small (0.005).
    """
    check_unit_interval("tau", tau)
    pairs = [
        (dict(target.named_parameters()), dict(source.named_parameters()), "parameters"),
        (dict(target.named_buffers()), dict(source.named_buffers()), "buffers"),
    ]
    for tgt, src, kind in pairs:
        if tgt.keys() != src.keys():
            raise ValueError(
                f"Expected source to have the target's {kind}, got differences "
                f"{sorted(set(tgt) ^ set(src))}"
            )
        for name, t in tgt.items():
            s = src[name]
            if t.shape != s.shape:
                raise ValueError(
                    f"Expected source {name} of shape {tuple(t.shape)} like the target's, "
                    f"got {tuple(s.shape)}"
                )
            if t.is_floating_point():
                t.lerp_(s.to(t.dtype), tau)
            else:
                t.copy_(s)


def cql_penalty(
    q_candidates: Tensor,
    q_data: Tensor,
    mask: Tensor,
    *,
    candidate_mask: Tensor | None = None,
) -> Tensor:
    """Conservative Q-learning penalty ``logsumexp_k Q(s, a_k) - Q(s, a_data)``.

    Added to the critic loss (times a weight) on offline data, it pushes down
    Q on actions the data does not take and up on the ones it does, so the
    policy is not drawn to over-estimated out-of-distribution actions. For an
    LLM critic the candidates are a few sampled alternative actions; include
    the data action among them so the penalty is >= 0.

    Args:
        q_candidates: ``[B, K]`` float, ``Q(s_b, a_k)`` for K candidate actions.
        q_data: ``[B]`` float, ``Q(s_b, a_data)`` of the action in the data.
        mask: ``[B]`` bool or 0/1; rows that count.
        candidate_mask: ``[B, K]`` bool or 0/1, optional; 1 on real
            candidates when rows have different numbers of them. Every counted
            row needs at least one.

    Returns:
        A differentiable scalar: the penalty averaged over counted rows.
    """
    q_candidates = check_float("q_candidates", q_candidates, ndim=2)
    q_data = check_float("q_data", q_data, ndim=1)
    check_shape("q_data", q_data, q_candidates.shape[:1], "q_candidates' first dimension")
    rows = as_bool_mask("mask", mask, q_data.shape, "q_data")
    if candidate_mask is None:
        valid = torch.ones_like(q_candidates, dtype=torch.bool)
    else:
        valid = as_bool_mask("candidate_mask", candidate_mask, q_candidates.shape, "q_candidates")
    if (rows & ~valid.any(1)).any():
        raise ValueError("Expected at least one candidate in every counted row, got a row with none")
    # Uncounted rows get finite zeros so logsumexp's backward never sees an all -inf row.
    q = torch.where(valid, q_candidates, -torch.inf)
    q = torch.where(rows.unsqueeze(1), q, 0.0)
    return masked_mean(torch.logsumexp(q, dim=1) - torch.where(rows, q_data, 0.0), rows)
