"""Preference losses as pure tensor functions: trajectory-level Bradley-Terry and turn-level DPO.

After SWEET-RL (Zhou et al. 2025, arXiv 2503.15478): an action-level critic
gives each turn a score; an episode's score is the sum of its turns' scores;
the critic learns from pairs of episodes of the same task with a
Bradley-Terry loss (the better one should score higher). The actor then learns
from pairs of candidate turns the critic ranked, with a DPO loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from polyturn.algos._validate import as_bool_mask, check_float, check_like, check_positive


def episode_scores(turn_scores: Tensor, mask: Tensor, *, lengths: Tensor | None = None) -> Tensor:
    """Sum of each episode's turn scores, ``[E, T] -> [E]``; masked turns count 0 (NaN included).

    ``lengths`` (``[E, T]``, e.g. each turn's token count): divide each turn's
    score by it first, the per-turn length normalisation that kept SWEET-RL's
    actor from collapsing to short replies (a long turn cannot win by summing more).
    """
    turn_scores = check_float("turn_scores", turn_scores, ndim=2)
    m = as_bool_mask("mask", mask, turn_scores.shape, "turn_scores")
    s = turn_scores
    if lengths is not None:
        lengths = check_like("lengths", lengths, "turn_scores", turn_scores)
        s = s / lengths.clamp_min(1.0)
    return torch.where(m, s, torch.zeros_like(s)).sum(1)


def bradley_terry_loss(score_better: Tensor, score_worse: Tensor, *, beta: float = 1.0,
                       weights: Tensor | None = None) -> dict[str, Tensor]:
    """``-log sigmoid(beta * (s_better - s_worse))``, averaged over pairs (weighted by ``weights``).

    Args:
        score_better: ``[P]`` float, the score of the better episode of each pair.
        score_worse: ``[P]`` float, the other's.
        beta: scale of the scores inside the sigmoid.
        weights: ``[P]`` optional non-negative pair weights (e.g. the return gap).

    Returns:
        ``loss`` (differentiable) and ``accuracy``: the share of pairs ranked right (strictly), no grad.
    """
    score_better = check_float("score_better", score_better, ndim=1)
    score_worse = check_like("score_worse", score_worse, "score_better", score_better)
    check_positive("beta", beta)
    if score_better.numel() == 0:
        raise ValueError("Expected at least one pair, got none")
    margin = beta * (score_better - score_worse)
    per_pair = -F.logsigmoid(margin)
    if weights is None:
        loss = per_pair.mean()
    else:
        weights = check_like("weights", weights, "score_better", score_better)
        loss = (per_pair * weights).sum() / weights.sum().clamp_min(1e-8)
    return {"loss": loss, "accuracy": (margin.detach() > 0).float().mean()}


def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor, ref_rejected_logps: Tensor,
             *, beta: float = 0.1) -> dict[str, Tensor]:
    """Turn-level DPO (Rafailov et al. 2023) on pairs of candidate turns from the same state.

    ``-log sigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))`` with each argument the
    ``[P]`` summed log-prob of a whole candidate turn (its action tokens) under the policy or the reference.

    Returns ``loss``, ``reward_margin`` (the mean implicit reward gap) and ``accuracy`` (share of pairs
    whose implicit reward ranks the chosen turn first); the last two without grad.
    """
    chosen_logps = check_float("chosen_logps", chosen_logps, ndim=1)
    for name, x in (("rejected_logps", rejected_logps), ("ref_chosen_logps", ref_chosen_logps),
                    ("ref_rejected_logps", ref_rejected_logps)):
        check_like(name, x, "chosen_logps", chosen_logps)
    check_positive("beta", beta)
    if chosen_logps.numel() == 0:
        raise ValueError("Expected at least one pair, got none")
    margin = beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps))
    loss = -F.logsigmoid(margin).mean()
    return {"loss": loss, "reward_margin": margin.detach().mean() / beta,
            "accuracy": (margin.detach() > 0).float().mean()}


def awr_weights(advantages: Tensor, mask: Tensor, *, temperature: float = 1.0, max_weight: float = 20.0) -> Tensor:
    """Advantage-weighted regression weights ``min(exp(A / temperature), max_weight)`` (0 where masked).

    With these as per-turn weights, the policy-gradient loss becomes a turn-weighted imitation (Peng et al. 2019).
    """
    advantages = check_float("advantages", advantages)
    m = as_bool_mask("mask", mask, advantages.shape, "advantages")
    check_positive("temperature", temperature)
    check_positive("max_weight", max_weight)
    w = torch.exp(torch.where(m, advantages, torch.zeros_like(advantages)) / temperature).clamp(max=max_weight)
    return torch.where(m, w, torch.zeros_like(w))


def redistributed_advantages(episode_adv: Tensor, turn_scores: Tensor, mask: Tensor, *,
                             temperature: float = 1.0) -> Tensor:
    """Spread each episode's advantage over its turns by the critic's turn scores, ``[E], [E, T] -> [E, T]``.

    Turn ``t`` of episode ``i`` gets ``A_i * n_i * softmax_t(sign(A_i) * s_it / temperature)`` (``n_i`` its
    turns): a success's credit goes mostly to the turns the critic scores highest, a failure's blame to the
    lowest. Each episode's advantages keep ``A_i``'s sign and sum to ``n_i * A_i``, as when every turn shares
    ``A_i``, which is what a large temperature gives back; masked turns get 0.
    """
    episode_adv = check_float("episode_adv", episode_adv)
    turn_scores = check_float("turn_scores", turn_scores)
    m = as_bool_mask("mask", mask, turn_scores.shape, "turn_scores")
    check_positive("temperature", temperature)
    if episode_adv.shape != turn_scores.shape[:1]:
        raise ValueError(f"episode_adv has shape {tuple(episode_adv.shape)}, expected ({turn_scores.shape[0]},)")
    sign = torch.where(episode_adv < 0, -1.0, 1.0).to(turn_scores.dtype)[:, None]
    logits = torch.where(m, sign * turn_scores / temperature, torch.full_like(turn_scores, float("-inf")))
    share = torch.softmax(logits, dim=1).nan_to_num(0.0)  # an all-masked row: 0
    n = m.sum(dim=1, keepdim=True).to(turn_scores.dtype)
    return torch.where(m, episode_adv[:, None] * n * share, torch.zeros_like(turn_scores))
