"""Policies an evaluation can run: actor checkpoints, the scripted ``expert`` and ``random``.

Actor policies run batched through :class:`polyturn.rollout.collector.Collector`
with the checkpoint's rollout settings; text policies (``expert``,
``random``) run one step at a time in :func:`run_text_episode`, which also
times each turn and records (instead of raising) an episode that crashes.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

import polyturn.envs  # noqa: F401  (registers the env ids)
from polyturn.config import TrainConfig, load_config
from polyturn.eval.testcases import TestCase

BUILTIN_POLICIES = ("expert", "random")


@dataclass
class PolicySpec:
    """A resolved policy argument: what to run and under which name it is reported."""

    label: str
    kind: Literal["actor", "expert", "random"]
    actor_dir: Path | None = None
    config: TrainConfig | None = None


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
    elif (path / "config.json").is_file():
        actor_dir, cfg_file, label = path, path.parent / "config.yaml", path.parent.name or path.name
    else:
        raise FileNotFoundError(
            f"Expected {path} to hold actor/ (a checkpoint) or config.json (an actor directory), found neither"
        )
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
    from polyturn.demos import EXPERTS

    env_id = env.spec.id if env.spec is not None else ""
    if env_id not in EXPERTS:
        raise ValueError(f"Expected an env with a scripted expert ({sorted(EXPERTS)}), got {env_id!r}")
    return EXPERTS[env_id](env, noise=0.0, seed=seed)


def _base_record(case: TestCase, *, policy: str, info: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "env_id": case.env, "seed": case.seed, "task_id": str(info.get("task_id", "")), "policy": policy,
        "success": False, "return": 0.0, "level": int(info.get("level", 0) or 0),
        "ambiguous": bool(info.get("ambiguous", False)), "question": str(info.get("question", "")),
        "privileged": str(info.get("privileged", "")), "key_actions": list(info.get("key_actions", [])),
        "turns": [], "final_observation": "", "crashed": False, "crash": None,
    }


def _exception_text(error: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(error), error)).strip()


def crash_record(case: TestCase, *, policy: str, error: BaseException, info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record of an episode that raised before it could finish."""
    return _base_record(case, policy=policy, info=info or {}) | {"crashed": True, "crash": _exception_text(error)}


def run_text_episode(env: gym.Env, policy: Any, case: TestCase, *, label: str) -> dict[str, Any]:
    """Play one test case with a text policy; latency is ``act`` plus ``step`` time.

    An exception while running is caught: the record keeps the turns played so
    far with ``crashed: true`` and the exception text in ``crash``.
    """
    info: dict[str, Any] = {}
    try:
        obs, info = env.reset(seed=case.seed, options=dict(case.options) or None)
    except Exception as e:  # noqa: BLE001  (a crash is a result to report, not a reason to stop)
        return crash_record(case, policy=label, error=e)
    rec = _base_record(case, policy=label, info=info)
    total = 0.0
    try:
        policy.reset(obs, info)
        while True:
            t0 = time.perf_counter()
            action = policy.act(obs, info)
            nobs, reward, terminated, truncated, sinfo = env.step(action)
            latency = time.perf_counter() - t0
            total += float(reward)
            rec["turns"].append({
                "observation": obs, "action": action, "reward": float(reward),
                "reward_terms": dict(sinfo.get("reward_terms", {})), "terminated": bool(terminated),
                "truncated": bool(truncated), "latency_s": latency, "forced": False,
                "info": {k: v for k, v in sinfo.items()
                         if k in ("action_type", "action_valid", "error", "features", "privileged", "success", "turn")},
            })
            obs, info = nobs, sinfo
            if terminated or truncated:
                rec["success"] = bool(sinfo.get("success", False))
                rec["final_observation"] = nobs
                break
    except Exception as e:  # noqa: BLE001
        rec.update(crashed=True, crash=_exception_text(e))
    rec["return"] = total
    return rec
