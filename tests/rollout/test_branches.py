"""Branches: a task's prefix is replayed as forced actions, and every built-in environment replays it exactly."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest
import torch

from polyturn.rollout.branches import BranchPoint, branch_points, branch_tasks, replayed
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings

ENVS = ["polyturn/SQLAnalyst-v0", "polyturn/Negotiation-v0", "polyturn/CustomerService-v0",
        "polyturn/TwentyQuestions-v0"]


def _collector(actor, env_id: str, n: int = 3) -> Collector:
    envs = [gym.make(env_id, disable_env_checker=True).unwrapped for _ in range(n)]
    return Collector(actor, envs, env_id=env_id, settings=RolloutSettings(max_action_tokens=24, context_budget=8192))


@pytest.mark.parametrize("env_id", ENVS)
def test_every_builtin_env_replays_a_prefix(tiny_actor, env_id):
    col = _collector(tiny_actor, env_id)
    # Random valid actions (epsilon 1) make real dialogues: queries, offers, customer replies, questions.
    eps = col.collect([{"seed": s, "options": {}} for s in range(4)], temperature=1.0, epsilon=1.0,
                      rng=np.random.default_rng(0), generator=torch.Generator().manual_seed(0))
    points = [BranchPoint(i, len(ep.turns) - 1) for i, ep in enumerate(eps)]
    tasks = branch_tasks([{"seed": s, "options": {}} for s in range(4)], points, eps, k=1)
    assert [len(t["prefix"]) for t in tasks] == [len(ep.turns) - 1 for ep in eps]
    branches = col.collect(tasks, temperature=1.0, generator=torch.Generator().manual_seed(1))
    for ep, br, p in zip(eps, branches, points):
        assert replayed(ep, br, p.turn)
        for j in range(p.turn):
            assert br.turns[j].forced and br.turns[j].action_ids == ep.turns[j].action_ids
        assert not br.turns[p.turn].forced  # the branch point itself is sampled


def test_replayed_notices_a_different_state(tiny_actor):
    col = _collector(tiny_actor, "polyturn/Negotiation-v0")
    eps = col.collect([{"seed": s, "options": {}} for s in (0, 1)], temperature=1.0, epsilon=1.0,
                      rng=np.random.default_rng(0), generator=torch.Generator().manual_seed(0))
    assert replayed(eps[0], eps[0], len(eps[0].turns) - 1)
    assert not replayed(eps[0], eps[1], 0)  # another task: another first observation
    assert not replayed(eps[0], eps[0], len(eps[0].turns))  # no turn there to branch at


def test_branch_points_are_distinct_turns_of_the_batch(tiny_actor):
    col = _collector(tiny_actor, "polyturn/SQLAnalyst-v0")
    eps = col.collect([{"seed": s, "options": {}} for s in range(3)], temperature=1.0,
                      generator=torch.Generator().manual_seed(0))
    n_turns = sum(len(ep.turns) for ep in eps)
    pts = branch_points(eps, 100, random.Random(0))
    assert len(pts) == len(set(pts)) == n_turns
    assert all(0 <= p.turn < len(eps[p.episode].turns) for p in pts)
    assert len(branch_points(eps, 2, random.Random(0))) == 2
    with pytest.raises(ValueError, match="k >= 1"):
        branch_tasks([{}], pts[:1], eps, k=0)
