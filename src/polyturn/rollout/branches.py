"""Branches: more continuations from one state of a collected episode, for turn-level labels.

A branch replays an episode's first ``t`` actions (forced, the exact ids) in a
fresh environment of the same task, then lets the policy sample turn ``t`` and
play on to the end. The branches of one state and the episode itself are
attempts that agree up to turn ``t`` and differ from there: their returns rank
their turn-``t`` actions by one Monte Carlo continuation each (the trainer's
``critic.branch_states``, docs/action-critic.md).

A branch counts only if the environment replayed the prefix: the same
observations before every turn up to ``t`` and the same rewards for the turns
before it (:func:`replayed`). An environment whose ``step`` draws randomness
outside its ``reset`` seed fails that check and its branches are dropped.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from polyturn.rollout.types import Episode


@dataclass(frozen=True)
class BranchPoint:
    """The state before turn ``turn`` of the batch's episode number ``episode``."""

    episode: int
    turn: int


def branch_points(episodes: Sequence[Episode], n: int, rng: random.Random) -> list[BranchPoint]:
    """Up to ``n`` distinct states drawn uniformly from all the turns of ``episodes``."""
    states = [BranchPoint(i, t) for i, ep in enumerate(episodes) for t in range(len(ep.turns))]
    return rng.sample(states, min(n, len(states)))


def branch_tasks(tasks: Sequence[dict], points: Sequence[BranchPoint], episodes: Sequence[Episode], *,
                 k: int) -> list[dict]:
    """``k`` collector tasks per point (``tasks[i]`` produced ``episodes[i]``): its task, prefixed with the
    episode's first ``turn`` actions."""
    if k < 1:
        raise ValueError(f"Expected k >= 1 branches per state, got {k}")
    out = []
    for p in points:
        prefix = [list(turn.action_ids) for turn in episodes[p.episode].turns[: p.turn]]
        out += [{**tasks[p.episode], "prefix": prefix}] * k
    return out


def replayed(original: Episode, branch: Episode, t: int) -> bool:
    """Whether ``branch`` reached the state before ``original``'s turn ``t``: the same observation before each of
    turns ``0..t`` and the same actions and rewards for turns ``0..t-1``."""
    if len(branch.turns) <= t:
        return False
    for j in range(t + 1):
        a, b = original.turns[j], branch.turns[j]
        if a.observation != b.observation:
            return False
        if j < t and (a.action_ids != b.action_ids or a.reward != b.reward):
            return False
    return True
