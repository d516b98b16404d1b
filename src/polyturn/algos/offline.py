"""Offline RL losses at turn level, as pure tensor functions: filtered BC, AWR, IQL, CQL.

A recorded episode is a sequence of turns ``(s_t, a_t, r_t)``; the critic gives ``V(s_t)`` and ``Q(s_t, a_t)`` per
turn, and the actor's loss is a weighted negative log-likelihood of the recorded action tokens, every token of
turn ``t`` weighted by turn ``t``'s weight (:func:`weighted_nll`). The algorithms differ in the weights and in
what the critic learns:

| algorithm | critic | actor weight of turn ``t`` |
|---|---|---|
| filtered BC | none | 1 if the episode's return is in the top fraction / above a threshold (:func:`return_filter`), else 0 |
| AWR | ``V`` on the returns (``value_loss``) | ``min(exp(A_t / T), w_max)``, ``A_t = R^lambda_t - V(s_t)`` (:func:`awr_weights`) |
| IQL | ``V`` by expectile regression on ``Q_target``, ``Q`` on ``r + gamma V(s')`` (:func:`iql_losses`) | the same, ``A_t = Q_target(s_t, a_t) - V(s_t)`` |
| CQL | ``Q`` on ``r + gamma V_target(s')`` plus ``alpha`` x the conservative penalty (:func:`cql_losses`) | the same, ``A_t = Q(s_t, a_t) - V(s_t)`` |
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from polyturn.algos._validate import as_bool_mask, check_float, check_like, check_unit_interval
from polyturn.algos.masked import masked_mean
from polyturn.algos.preference import awr_weights
from polyturn.algos.value import cql_penalty

__all__ = ["awr_weights", "cql_losses", "cql_penalty", "expectile_loss", "iql_losses", "return_filter",
           "weighted_nll"]


def return_filter(returns: Tensor, *, top_fraction: float | None = None, min_return: float | None = None) -> Tensor:
    """Filtered BC's choice of episodes: ``[E]`` bool, True for the episodes to imitate.

    ``top_fraction`` keeps the ``ceil(top_fraction x E)`` highest returns (every episode tied with the lowest of
    them too); ``min_return`` keeps returns ``>= min_return``; with both, an episode must pass both; with neither,
    every episode is kept (plain BC).

    >>> return_filter(torch.tensor([1.0, 5.0, 3.0, 5.0]), top_fraction=0.25).tolist()
    [False, True, False, True]
    >>> return_filter(torch.tensor([1.0, 5.0, 3.0]), top_fraction=0.5, min_return=4.0).tolist()
    [False, True, False]
    """
    returns = check_float("returns", returns, ndim=1)
    keep = torch.ones_like(returns, dtype=torch.bool)
    if top_fraction is not None:
        if not 0.0 < top_fraction <= 1.0:
            raise ValueError(f"Expected top_fraction in (0, 1], got {top_fraction}")
        if returns.numel():
            k = max(1, math.ceil(top_fraction * returns.numel()))
            keep &= returns >= torch.topk(returns, k).values[-1]
    if min_return is not None:
        keep &= returns >= min_return
    return keep


def weighted_nll(logprobs: Tensor, weights: Tensor, mask: Tensor, *, correct: Tensor | None = None) -> dict[str, Tensor]:
    """The actor's loss on recorded actions: ``sum_i w_i * (-log pi(x_i)) / N`` over the N action tokens of ``mask``.

    With every weight 1 it is BC's token-mean NLL; with AWR's weights it is advantage-weighted regression (each
    token weighted by its turn's weight, so a turn's weight acts on its whole action).

    Args:
        logprobs: ``[B, L]`` float, the actor's log-prob of each target token (differentiable).
        weights: ``[B, L]`` float, same dtype, non-negative; treated as constants.
        mask: ``[B, L]`` bool or 0/1; 1 on the recorded action tokens.
        correct: ``[B, L]`` optional, 1 where the actor's argmax is the target (``token_accuracy``).

    Returns:
        ``loss`` (differentiable), ``nll`` (the unweighted token-mean NLL), ``weight_mean`` (over action tokens)
        and, with ``correct``, ``token_accuracy``; diagnostics without grad.
    """
    logprobs = check_float("logprobs", logprobs)
    weights = check_like("weights", weights, "logprobs", logprobs).detach()
    m = as_bool_mask("mask", mask, logprobs.shape, "logprobs")
    if (torch.where(m, weights, 0.0) < 0).any():
        raise ValueError("Expected non-negative weights, got a negative one")
    out = {"loss": masked_mean(-weights * torch.where(m, logprobs, 0.0), m)}
    with torch.no_grad():
        out["nll"] = masked_mean(-logprobs.detach(), m)
        out["weight_mean"] = masked_mean(weights, m)
        if correct is not None:
            hit = as_bool_mask("correct", correct, logprobs.shape, "logprobs")
            out["token_accuracy"] = masked_mean(hit.to(logprobs.dtype), m)
    return out


def expectile_loss(diff: Tensor, mask: Tensor, *, expectile: float) -> Tensor:
    """IQL's asymmetric square ``mean |tau - 1(u < 0)| * u^2`` over ``mask``, with ``u = diff = target - prediction``.

    ``tau = 0.5`` is half the mean squared error; ``tau`` near 1 fits an upper expectile of the target (a
    prediction below the target costs ``tau``, above it ``1 - tau``).

    >>> float(expectile_loss(torch.tensor([2.0, -2.0]), torch.ones(2), expectile=0.9))  # (0.9 * 4 + 0.1 * 4) / 2
    2.0
    """
    diff = check_float("diff", diff)
    m = as_bool_mask("mask", mask, diff.shape, "diff")
    if not 0.0 < expectile < 1.0:
        raise ValueError(f"Expected expectile in (0, 1), got {expectile}")
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return masked_mean(weight * diff**2, m)


def iql_losses(v: Tensor, q: Tensor, q_target: Tensor, next_v: Tensor, rewards: Tensor, done: Tensor, mask: Tensor, *,
               gamma: float, expectile: float) -> dict[str, Tensor]:
    """Implicit Q-learning's critic losses (Kostrikov et al. 2021) on a batch of turns::

        L_V = mean |tau - 1(u < 0)| u^2,    u = Q_target(s, a) - V(s)        (expectile regression, no max over a)
        y   = r + gamma * (1 - done) * V(s')                                  (no grad)
        L_Q = 0.5 * mean (Q(s, a) - y)^2
        loss = L_V + L_Q

    Args:
        v, q: ``[B]`` float, the critic's ``V(s_t)`` and ``Q(s_t, a_t)`` (differentiable).
        q_target: ``[B]``, the target network's ``Q(s_t, a_t)`` (no grad).
        next_v: ``[B]``, ``V(s_{t+1})`` (no grad; ignored where ``done``).
        rewards: ``[B]``, the turns' rewards.
        done: ``[B]`` bool or 0/1: nothing follows the turn (terminated, or the env's turn limit).
        mask: ``[B]`` bool or 0/1: turns that count.
        gamma: discount in [0, 1]; expectile: tau in (0, 1).

    Returns:
        ``loss``, ``v_loss``, ``q_loss`` (differentiable) and ``adv_mean`` (mean ``Q_target - V``, no grad).
    """
    v = check_float("v", v, ndim=1)
    q = check_like("q", q, "v", v)
    q_target = check_like("q_target", q_target, "v", v).detach()
    next_v = check_like("next_v", next_v, "v", v).detach()
    rewards = check_like("rewards", rewards, "v", v)
    end = as_bool_mask("done", done, v.shape, "v")
    m = as_bool_mask("mask", mask, v.shape, "v")
    check_unit_interval("gamma", gamma)
    v_loss = expectile_loss(q_target - v, m, expectile=expectile)
    y = rewards + gamma * torch.where(end, 0.0, next_v)
    q_loss = 0.5 * masked_mean((q - y) ** 2, m)
    return {"loss": v_loss + q_loss, "v_loss": v_loss, "q_loss": q_loss,
            "adv_mean": masked_mean((q_target - v).detach(), m)}


def cql_losses(q_data: Tensor, q_sampled: Tensor, v: Tensor, targets: Tensor, mask: Tensor, *, alpha: float,
               sampled_mask: Tensor | None = None) -> dict[str, Tensor]:
    """Conservative Q-learning (Kumar et al. 2020) on a turn-level Q with candidate actions::

        L_TD    = 0.5 * mean (Q(s, a_data) - y)^2                 y = r + gamma (1 - done) V_target(s'), given
        penalty = mean [ logsumexp_{a in {a_data, a_1..a_K}} Q(s, a) - Q(s, a_data) ]    (>= 0)
        L_V     = 0.5 * mean (V(s) - mean_k Q(s, a_k))^2          a_k ~ the current actor; Q here without grad
        loss    = L_TD + alpha * penalty + L_V

    The penalty's gradient is ``softmax_k`` on each candidate's Q (down) and ``softmax_data - 1`` on the data
    action's (up): it lowers Q of actions the data does not take relative to the one it does, and vanishes at
    ``alpha = 0``. ``V`` learns the current actor's value under this Q (the expected-SARSA backup of actor-critic
    CQL, since a text action space has no max), which is what ``y`` bootstraps from and what the online phase reads.

    Args:
        q_data: ``[B]`` float, ``Q(s_t, a_t)`` of the recorded action (differentiable).
        q_sampled: ``[B, K]`` float, ``Q(s_t, a_k)`` of K actions sampled from the actor at ``s_t``.
        v: ``[B]`` float, ``V(s_t)`` (differentiable).
        targets: ``[B]``, the TD targets ``y`` (no grad; :func:`polyturn.algos.value.td_targets`).
        mask: ``[B]`` bool or 0/1: turns that count.
        alpha: the penalty's weight, >= 0.
        sampled_mask: ``[B, K]`` optional, 1 on real candidates (a state may have fewer than K).

    Returns:
        ``loss``, ``td_loss``, ``penalty``, ``v_loss`` and, without grad, ``q_data_mean``, ``q_sampled_mean`` and
        ``gap`` (mean ``Q(s, a_data) - mean_k Q(s, a_k)``).
    """
    q_data = check_float("q_data", q_data, ndim=1)
    q_sampled = check_float("q_sampled", q_sampled, ndim=2)
    v = check_like("v", v, "q_data", q_data)
    targets = check_like("targets", targets, "q_data", q_data).detach()
    m = as_bool_mask("mask", mask, q_data.shape, "q_data")
    if q_sampled.shape[0] != q_data.shape[0]:
        raise ValueError(f"Expected q_sampled of shape ({q_data.shape[0]}, K) like q_data, got {tuple(q_sampled.shape)}")
    if alpha < 0:
        raise ValueError(f"Expected alpha >= 0, got {alpha}")
    valid = (torch.ones_like(q_sampled, dtype=torch.bool) if sampled_mask is None
             else as_bool_mask("sampled_mask", sampled_mask, q_sampled.shape, "q_sampled"))
    td_loss = 0.5 * masked_mean((q_data - targets) ** 2, m)
    candidates = torch.cat([q_data[:, None], q_sampled], dim=1)  # the data action is always a candidate
    cand_mask = torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)
    penalty = cql_penalty(candidates, q_data, m, candidate_mask=cand_mask)
    n = valid.sum(1).clamp_min(1).to(q_sampled.dtype)
    sampled_mean = (torch.where(valid, q_sampled, 0.0).sum(1) / n).detach()
    has = m & valid.any(1)
    v_loss = 0.5 * masked_mean((v - sampled_mean) ** 2, has)
    loss = td_loss + v_loss + alpha * penalty
    with torch.no_grad():
        stats = {"q_data_mean": masked_mean(q_data.detach(), m), "q_sampled_mean": masked_mean(sampled_mean, has),
                 "gap": masked_mean(q_data.detach() - sampled_mean, has)}
    return {"loss": loss, "td_loss": td_loss, "penalty": penalty, "v_loss": v_loss, **stats}
