"""Playing games of a multi-role environment: its training partners, and a policy's episodes in one seat.

Evaluation-only partners (an env spec's ``holdout_partners``) are not here on purpose: only :mod:`polyturn.eval`
loads them, so no training path can reach them (tests/train/test_selfplay.py checks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from polyturn.acting.registry import spec_or_none
from polyturn.envs.multi_agent import SeatedEnv
from polyturn.envs.spec import load_attr
from polyturn.models.actor import Actor
from polyturn.rollout.multi import MultiAgentCollector, Player, Seat
from polyturn.rollout.types import Episode


def training_partners(env_id: str) -> dict[str, Callable[[], Player]]:
    """The env's scripted training partners by name (its spec's ``partners``); empty when it names none."""
    spec = spec_or_none(env_id)
    if spec is None or not getattr(spec, "partners", None):
        return {}
    return dict(load_attr(spec.partners))


def seat(env: Any, env_id: str, *, role: str | None = None, partner: str | None = None) -> SeatedEnv:
    """A multi-role env played from ``role``'s seat (default: the first role), the others filled by the training
    partner ``partner`` (default: the first by name); a ``ValueError`` names what is allowed."""
    env = env.unwrapped
    partners = training_partners(env_id)
    if not partners:
        raise ValueError(f"Expected {env_id} to name scripted partners (EnvSpec.partners) to fill the other seats, "
                         "got none")
    name = partner or sorted(partners)[0]
    if name not in partners:
        raise ValueError(f"Expected partner among {sorted(partners)}, got {partner!r}")
    role = role or env.roles[0]
    if role not in env.roles:
        raise ValueError(f"Expected role among {list(env.roles)}, got {role!r}")
    return SeatedEnv(env, role=role, partners={r: partners[name] for r in env.roles if r != role})


def seated_games(tasks: Sequence[Mapping[str, Any]], roles: Sequence[str], *, actors: Mapping[str, Actor],
                 label: str, partners: Mapping[str, Callable[[], Player]]) -> tuple[list[dict], list[str]]:
    """One game per task with the policy (``label``; ``actors[role]`` plays ``role``) in one seat and a scripted
    partner in every other: task ``k`` seats the policy in role ``roles[k % len(roles)]`` against partner
    ``k // len(roles)`` (cycling by name), so the roles and the partners are played equally often. Returns the
    games and the policy's role in each."""
    names = sorted(partners)
    if not names:
        raise ValueError("Expected at least one scripted partner to seat against the policy, got none")
    games, mine = [], []
    for k, task in enumerate(tasks):
        role = roles[k % len(roles)]
        partner = names[(k // len(roles)) % len(names)]
        seats = {r: Seat(label, actor=actors[r]) if r == role
                 else Seat(f"scripted:{partner}", player=partners[partner]) for r in roles}
        games.append({**task, "seats": seats})
        mine.append(role)
    return games, mine


def play_seated(collector: MultiAgentCollector, games: Sequence[dict], roles: Sequence[str], *, temperature: float,
                seed: int, progress: Callable[[int], None] | None = None) -> list[Episode]:
    """Play ``games``; the episode of the seat in ``roles[k]`` of game ``k``, in game order (sampling seeded by
    ``seed``, as :func:`polyturn.acting.checkpoint.run_actor` seeds it)."""
    actor = next(s.actor for g in games for s in g["seats"].values() if s.actor is not None)
    generator = torch.Generator(device=actor.device).manual_seed(seed)
    out = collector.collect(games, temperature=temperature, generator=generator, progress=progress)
    return [eps[r] for eps, r in zip(out, roles)]
