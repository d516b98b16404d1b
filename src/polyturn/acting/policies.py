"""Policies that evaluation, ``play`` and ``serve`` can run: actor checkpoints, the scripted ``expert``, ``random``.

Actor policies are loaded and run by :mod:`polyturn.acting.checkpoint` (the
batched :class:`polyturn.rollout.collector.Collector` with the checkpoint's
rollout settings); text policies (``expert``, ``random``) run one step at a
time in :func:`polyturn.acting.episodes.run_episode` (``for_eval=True`` times
each turn and records, instead of raising, an episode that crashes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from polyturn.acting.registry import make_expert
from polyturn.config import TrainConfig, load_config

BUILTIN_POLICIES = ("expert", "random")


@dataclass
class PolicySpec:
    """A resolved policy argument: what to run and under which name it is reported."""

    label: str
    kind: Literal["actor", "expert", "random"]
    actor_dir: Path | None = None
    config: TrainConfig | None = None


def _is_model_dir(path: Path) -> bool:
    """A saved Hugging Face model (config.json) or peft adapter (adapter_config.json)."""
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def resolve_policy(arg: str) -> PolicySpec:
    """Turn a ``--policy_checkpoint`` argument into a :class:`PolicySpec`.

    Accepted: ``expert``, ``random``; a checkpoint directory (``ckpt-*``
    holding ``actor/`` and ``config.yaml``); an ``actor/`` directory itself
    (its config is read from ``../config.yaml`` when present); a run directory
    with a ``latest`` marker (its newest checkpoint).
    """
    if arg in BUILTIN_POLICIES:
        return PolicySpec(label=arg, kind=arg)  # type: ignore[arg-type]
    path = Path(arg)
    if not path.is_dir():
        raise FileNotFoundError(
            f"Expected a checkpoint directory (holding actor/ and config.yaml), an actor/ directory, "
            f"or one of {', '.join(BUILTIN_POLICIES)}; got {arg!r}, which does not exist"
        )
    if (path / "latest").is_file() and not (path / "actor").is_dir():
        path = path / (path / "latest").read_text().strip()
    if (path / "actor").is_dir():
        actor_dir, cfg_file, label = path / "actor", path / "config.yaml", path.name
    elif _is_model_dir(path):
        actor_dir, cfg_file, label = path, path.parent / "config.yaml", path.parent.name or path.name
    else:
        raise FileNotFoundError(
            f"Expected {path} to hold actor/ (a checkpoint) or config.json (an actor directory), found neither"
        )
    if not _is_model_dir(actor_dir):
        raise FileNotFoundError(f"Expected a saved actor in {actor_dir} (config.json or adapter_config.json), "
                                "found neither; pass a checkpoint written by polyturn train")
    config = load_config(cfg_file) if cfg_file.is_file() else load_config(None)
    return PolicySpec(label=label, kind="actor", actor_dir=actor_dir, config=config)


def unique_labels(specs: list[PolicySpec]) -> None:
    """Make labels unique in place: repeats get the parent directory's name, then a counter."""
    seen: dict[str, int] = {}
    for s in specs:
        if s.label in seen and s.actor_dir is not None:
            s.label = f"{s.actor_dir.parent.parent.name}/{s.label}" if s.actor_dir.name == "actor" else s.label
        base, k = s.label, 2
        while s.label in seen:
            s.label = f"{base}#{k}"
            k += 1
        seen[s.label] = 1


class RandomPolicy:
    """Uniformly random valid actions, from the env's ``sample_valid_action(rng)``."""

    def __init__(self, env: gym.Env, *, seed: int) -> None:
        self.env = env.unwrapped
        self.rng = np.random.default_rng(seed)
        self.name = "random"

    def reset(self, obs: str, info: Mapping[str, Any]) -> None:
        """Nothing to reset: each action is drawn afresh."""

    def act(self, obs: str, info: Mapping[str, Any]) -> str:
        """A random valid action for the current state."""
        return self.env.sample_valid_action(self.rng)


def make_text_policy(kind: Literal["expert", "random"], env: gym.Env, *, seed: int) -> Any:
    """A fresh text policy for one episode (fresh per episode, so results do not depend on case order)."""
    if kind == "random":
        if not hasattr(env.unwrapped, "sample_valid_action"):
            raise ValueError(
                f"Expected {type(env.unwrapped).__name__} to provide sample_valid_action(rng) for the random policy, got none"
            )
        return RandomPolicy(env, seed=seed)
    return make_expert(env, noise=0.0, seed=seed)
