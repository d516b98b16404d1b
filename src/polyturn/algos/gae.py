"""Turn-level generalized advantage estimation (GAE) and its helpers.

Credit is assigned per agent turn: the critic gives ``V(s_t)`` for the state in
which the actor writes turn ``t``; GAE runs over turns; every action token of
turn ``t`` then shares the turn's advantage (:func:`token_advantages`).

Batches are ``[episodes, turns]`` and padded: ``mask`` is 1 on an episode's
real turns, which come first in each row, and 0 on the padding after them.

A turn may last several environment steps: a hierarchical agent's manager
chooses an option (a subgoal) that its worker pursues for ``d`` steps. Credit
is then a semi-MDP over the manager's turns: the turn's reward is the
discounted sum of its steps' rewards and it discounts by ``gamma ** d``
(:func:`semi_mdp_rewards` computes both; :func:`turn_gae` takes the
discounts as a per-turn ``gamma``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from polyturn.algos._validate import (
    as_bool_mask,
    check_float,
    check_like,
    check_positive,
    check_shape,
    check_tensor,
    check_unit_interval,
    per_row_rate,
)
from polyturn.algos.masked import masked_mean


def _check_prefix(mask: Tensor) -> Tensor:
    """Raise unless each row of ``mask`` is ones then zeros; return the last-real-turn mask."""
    gap = mask[:, 1:] & ~mask[:, :-1]
    if gap.any():
        row = int(gap.any(1).nonzero()[0])
        raise ValueError(
            "Expected mask to hold each episode's real turns first and padding after, "
            f"got a 1 after a 0 in row {row}"
        )
    after = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    return mask & ~after


def _per_turn_gamma(gamma: Tensor, shape: torch.Size, like: Tensor) -> Tensor:
    """A per-turn ``gamma`` ``[E, T]`` checked against ``shape`` and [0, 1], in ``like``'s dtype and device."""
    if tuple(gamma.shape) != tuple(shape):
        raise ValueError(
            f"Expected a per-turn gamma of shape {tuple(shape)} like rewards (or a float, or a tensor of "
            f"shape ({shape[0]},) for one per episode), got shape {tuple(gamma.shape)}"
        )
    bad = ~((gamma >= 0) & (gamma <= 1))
    if bad.any():
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"Expected every per-turn gamma in [0, 1] (a turn of d steps discounts by gamma ** d), "
            f"got {float(gamma[at])} at (episode, turn) {at}"
        )
    return gamma.to(dtype=like.dtype, device=like.device)


def turn_gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    mask: Tensor,
    *,
    gamma: float | Tensor,
    lam: float | Tensor,
) -> tuple[Tensor, Tensor]:
    """GAE over the turns of padded episodes.

    Convention: ``next_values[:, t]`` is ``V(s_{t+1})``, the critic's value of
    the state *after* turn ``t``, and it is used at every real turn::

        delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
        A_t     = delta_t + gamma * lam * A_{t+1}      (A = 0 after the last real turn)
        returns = A + values

    ``gamma`` may differ per turn (an ``[E, T]`` tensor): turn ``t``'s own
    ``gamma_t`` then discounts both its bootstrap and the decay ``gamma_t * lam``
    to the next turn. A semi-MDP turn that lasted ``d_t`` environment steps
    passes ``gamma_t = gamma ** d_t`` with the discounted sum of its steps'
    rewards as ``r_t`` (:func:`semi_mdp_rewards`); ``d_t = 1`` everywhere is
    ordinary GAE.

    For a turn that is not the episode's last, ``next_values[:, t]`` should be
    ``values[:, t+1]``; for the last real turn it is the value of the final
    state: a truncated episode bootstraps from it, a terminated one ignores it.
    :func:`next_state_values` builds this tensor from ``values`` and the final
    states' values. ``next_values`` is ignored (NaN is fine) at padded
    positions and at terminated turns.

    Args:
        rewards: ``[E, T]`` float, reward of each turn.
        values: ``[E, T]`` float, same dtype, ``V(s_t)``.
        next_values: ``[E, T]`` float, same dtype, ``V(s_{t+1})`` (see above).
        terminated: ``[E, T]`` bool or 0/1; 1 only on the last real turn of an
            episode that reached a terminal state (not on a truncated one).
        mask: ``[E, T]`` bool or 0/1; 1 on real turns, a prefix of each row.
        gamma: discount in [0, 1]; a float, ``[E]`` for one per episode, or
            ``[E, T]`` for one per turn (read at real turns only; any value
            in [0, 1] at padding).
        lam: GAE lambda in [0, 1]; a float, or ``[E]``.

    Returns:
        ``(advantages, returns)``, both ``[E, T]`` with the dtype of ``rewards``
        and 0 at padded positions. Gradients flow if the inputs carry them;
        callers normally pass detached critic values.
    """
    rewards = check_float("rewards", rewards, ndim=2)
    values = check_like("values", values, "rewards", rewards)
    next_values = check_like("next_values", next_values, "rewards", rewards)
    shape = rewards.shape
    m = as_bool_mask("mask", mask, shape, "rewards")
    term = as_bool_mask("terminated", terminated, shape, "rewards")
    last = _check_prefix(m)
    if (term & ~last).any():
        raise ValueError(
            "Expected terminated to be 1 only on the last real turn of an episode, "
            f"got 1 at (episode, turn) {tuple(int(i) for i in (term & ~last).nonzero()[0])}"
        )
    per_turn = isinstance(gamma, Tensor) and gamma.ndim == 2
    g = _per_turn_gamma(gamma, shape, rewards) if per_turn else per_row_rate("gamma", gamma, shape[0], rewards)
    lm = per_row_rate("lam", lam, shape[0], rewards)

    # where, not a (1 - terminated) product, so a NaN placeholder after a terminal turn is dropped too.
    bootstrap = torch.where(term, 0.0, next_values)
    delta = torch.where(m, rewards + g * bootstrap - values, 0.0)
    decay = g * lm  # a float, [E, 1], or [E, T] with a per-turn gamma
    running = rewards.new_zeros(shape[0], 1)
    advantages = []
    for t in reversed(range(shape[1])):
        # Padding is a suffix with delta 0 and termination only happens on the last real turn,
        # so `running` is already 0 there: no (1 - terminated) factor is needed in the recursion.
        running = delta[:, t : t + 1] + (decay[:, t : t + 1] if per_turn else decay) * running
        advantages.append(running)
    adv = torch.cat(advantages[::-1], dim=1) if advantages else torch.zeros_like(rewards)
    adv = torch.where(m, adv, 0.0)
    returns = torch.where(m, adv + values, 0.0)
    return adv, returns


def semi_mdp_rewards(
    step_rewards: Tensor | Sequence[float], durations: Tensor | Sequence[int], gamma: float
) -> tuple[Tensor, Tensor]:
    """Rewards and discounts of a semi-MDP's turns (options) from the rewards of the steps they span.

    Option ``j`` starts at step ``t_j`` (the sum of the durations before it)
    and lasts ``d_j`` steps::

        R_j        = sum_{i=0}^{d_j - 1} gamma**i * r_{t_j + i}
        discount_j = gamma ** d_j

    These are the ``rewards`` row and the per-turn ``gamma`` row that
    :func:`turn_gae` takes for the episode's option turns.

    The durations must cover the steps exactly. An option the episode cut
    short (truncation or termination before its planned end) counts the steps
    it actually ran: the bootstrap ``gamma ** d_j * V(s_{j+1})`` is then taken
    at the state where the episode stopped, as for any truncated turn.

    Args:
        step_rewards: ``[N]`` float (or a sequence of floats), each env step's
            reward in order, for one episode.
        durations: ``[J]`` integers >= 1 (tensor or sequence), the steps each
            option lasted, in order, summing to ``N``.
        gamma: the per-step discount in [0, 1].

    Returns:
        ``(rewards, discounts)``, both ``[J]`` with the dtype of
        ``step_rewards`` (float32 for a sequence).

    >>> r, g = semi_mdp_rewards([1.0, 1.0, 1.0], [2, 1], gamma=0.5)
    >>> r.tolist(), g.tolist()
    ([1.5, 1.0], [0.25, 0.5])
    """
    r = step_rewards if isinstance(step_rewards, Tensor) else torch.tensor(step_rewards, dtype=torch.float32)
    r = check_float("step_rewards", r, ndim=1)
    if isinstance(durations, Tensor):
        d = durations
        ok = not (d.is_floating_point() or d.is_complex() or d.dtype == torch.bool) and d.ndim == 1
    else:
        ok = all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in durations)
        d = torch.tensor(list(durations) if ok else [], dtype=torch.long)
    if not ok:
        raise ValueError(
            f"Expected durations to be a 1-D sequence of integers (the steps of each option), got {durations!r}"
        )
    if (d < 1).any():
        raise ValueError(
            f"Expected every duration >= 1 (an option lasts at least one step), got {int(d.min())} at option "
            f"{int((d < 1).nonzero()[0])}"
        )
    if int(d.sum()) != r.shape[0]:
        raise ValueError(
            f"Expected durations to sum to the number of step rewards ({r.shape[0]}), got {int(d.sum())}; "
            "an option cut short by the episode's end counts the steps it actually ran"
        )
    check_unit_interval("gamma", float(gamma))
    d = d.to(r.device)
    option = torch.repeat_interleave(torch.arange(d.shape[0], device=r.device), d)  # the option of each step
    start = torch.cumsum(d, 0) - d
    within = (torch.arange(r.shape[0], device=r.device) - start[option]).to(r.dtype)  # i in gamma**i
    base = r.new_tensor(float(gamma))
    rewards = r.new_zeros(d.shape[0]).index_add_(0, option, r * base**within)
    return rewards, base ** d.to(r.dtype)


def next_state_values(values: Tensor, mask: Tensor, final_values: Tensor) -> Tensor:
    """Build the ``next_values`` argument of :func:`turn_gae`.

    Args:
        values: ``[E, T]`` float, ``V(s_t)`` of each turn's state.
        mask: ``[E, T]`` bool or 0/1; real turns, a prefix of each row.
        final_values: ``[E]`` float, ``V`` of the state after each episode's
            last real turn (used only if that turn was truncated; pass 0 for
            terminated episodes).

    Returns:
        ``[E, T]``: ``values[:, t+1]`` before the last real turn,
        ``final_values`` at it, 0 on padding.
    """
    values = check_float("values", values, ndim=2)
    m = as_bool_mask("mask", mask, values.shape, "values")
    final_values = check_float("final_values", final_values)
    check_shape("final_values", final_values, values.shape[:1], "values' first dimension")
    last = _check_prefix(m)
    shifted = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    out = torch.where(last, final_values.to(values.dtype).unsqueeze(1), shifted)
    return torch.where(m, out, 0.0)


def token_advantages(turn_advantages: Tensor, turn_index: Tensor) -> Tensor:
    """Give every action token the advantage of the turn it belongs to.

    Args:
        turn_advantages: ``[E, T]`` float, from :func:`turn_gae`.
        turn_index: ``[E, L]`` integer; the turn (0..T-1) of each action token
            of row ``e``'s token sequence, -1 on every other token (prompt,
            observations, tool output, padding).

    Returns:
        ``[E, L]`` float: ``turn_advantages[e, turn_index[e, l]]``, 0 where
        ``turn_index`` is -1.
    """
    turn_advantages = check_float("turn_advantages", turn_advantages, ndim=2)
    turn_index = check_tensor("turn_index", turn_index)
    if turn_index.is_floating_point() or turn_index.dtype == torch.bool:
        raise TypeError(f"Expected turn_index to be an integer tensor, got dtype {turn_index.dtype}")
    if turn_index.ndim != 2 or turn_index.shape[0] != turn_advantages.shape[0]:
        raise ValueError(
            f"Expected turn_index of shape ({turn_advantages.shape[0]}, L) like turn_advantages' "
            f"first dimension, got {tuple(turn_index.shape)}"
        )
    n_turns = turn_advantages.shape[1]
    if turn_index.numel() and (turn_index.min() < -1 or turn_index.max() >= n_turns):
        raise ValueError(
            f"Expected turn_index in [-1, {n_turns - 1}], "
            f"got values in [{int(turn_index.min())}, {int(turn_index.max())}]"
        )
    is_action = turn_index >= 0
    if n_turns == 0:
        return torch.zeros(turn_index.shape, dtype=turn_advantages.dtype, device=turn_advantages.device)
    gathered = torch.gather(turn_advantages, 1, turn_index.clamp(min=0).long())
    return torch.where(is_action, gathered, 0.0)


def normalize(x: Tensor, mask: Tensor, *, eps: float = 1e-8, weights: Tensor | None = None) -> Tensor:
    """Whiten ``x`` with the mean and (population) std of its masked entries.

    Args:
        x: floating tensor, any shape (e.g. advantages ``[E, T]`` or ``[B, L]``).
        mask: bool or 0/1 tensor, same shape; the entries that count.
        eps: added to the std so a constant ``x`` gives 0, not NaN.
        weights: optional non-negative tensor, same shape: each entry counts this
            many times. Turn advantages weighted by each turn's number of action
            tokens are whitened as the token-level loss will see them, so long
            turns cannot tilt the mean push on the policy (a net push-down of
            sampled tokens raises entropy).

    Returns:
        ``(x - mean) / (std + eps)`` where ``mask`` is 1, 0 elsewhere.
    """
    x = check_float("x", x)
    m = as_bool_mask("mask", mask, x.shape, "x")
    check_positive("eps", eps)
    if weights is None:
        mean = masked_mean(x, m)
        std = masked_mean((x - mean) ** 2, m).sqrt()
    else:
        w = check_like("weights", weights, "x", x)
        if (w < 0).any():
            raise ValueError("Expected non-negative weights, got a negative one")
        w = torch.where(m, w, 0.0)
        total = w.sum().clamp_min(eps)
        mean = (w * x).sum() / total
        std = ((w * (x - mean) ** 2).sum() / total).sqrt()
    return torch.where(m, (x - mean) / (std + eps), 0.0)
