"""Load a checkpoint and run its actor through the batched collector: the one way to do it.

Training evaluation (``Trainer.evaluate``), ``polyturn evaluate``,
``polyturn diagnose`` and ``polyturn play`` all play an actor on tasks here:

* :func:`load_checkpoint` loads the actor and config of any directory
  ``polyturn evaluate`` accepts (a checkpoint, an ``actor/`` directory, a run
  directory's latest checkpoint);
* :func:`run_actor` plays tasks with a :class:`LoadedCheckpoint` (in fresh
  environments, with the checkpoint's rollout settings) or with a live
  :class:`~polyturn.rollout.collector.Collector` (the trainer's, in its own
  environments); temperature 0 decodes greedily, above 0 samples from a
  ``torch.Generator`` seeded with ``seed``;
* :func:`held_out_tasks` are the held-out task seeds a config evaluates on.

A hierarchical checkpoint (its config has ``hierarchy:``; the manager is its ``actor/``, the worker
``roles/worker/actor/``) loads both policies; its ``actor`` is the worker, the policy that acts on the env, and
:func:`run_actor` plays every task with the manager setting the worker's subgoals
(:class:`~polyturn.acting.hierarchy.HierarchyCollector`) and returns the worker's episodes.

Torch's thread count is the caller's choice (the trainer uses
``run.rollout_threads``; the commands use one thread, fastest for small batches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polyturn.acting.hierarchy import HierarchyCollector
from polyturn.acting.policies import PolicySpec, resolve_policy
from polyturn.acting.registry import make_env
from polyturn.config import TrainConfig
from polyturn.models.actor import Actor, load_actor
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime


def rollout_settings(cfg: TrainConfig) -> RolloutSettings:
    """The rollout settings (action cap, context budget, system prompt, top-p) of a run's config."""
    r = cfg.rollout
    return RolloutSettings(
        max_action_tokens=r.max_action_tokens,
        context_budget=r.context_budget,
        keep_last_turns=r.keep_last_turns,
        system_prompt=r.system_prompt,
        top_p=r.top_p,
    )


@dataclass
class LoadedCheckpoint:
    """An actor loaded from disk with the config it was trained with; for a hierarchical checkpoint ``actor`` is
    the worker (from ``actor_dir``) and ``manager`` the policy that sets its subgoals."""

    label: str
    actor_dir: Path
    actor: Actor
    config: TrainConfig
    manager: Actor | None = None

    @property
    def settings(self) -> RolloutSettings:
        """The rollout settings (context budget, action cap, system prompt ...) of its config."""
        return rollout_settings(self.config)

    def collector(self, envs: Sequence[Any], *, env_id: str, best_of: int = 1,
                  scorer: Callable[[Sequence[Any]], Sequence[float]] | None = None) -> Collector | HierarchyCollector:
        """A :class:`Collector` of this actor in ``envs`` (unwrapped environments of ``env_id``); ``best_of`` > 1
        plays ``scorer``'s favourite of that many candidate turns (:mod:`polyturn.rollout.best_of`). A hierarchical
        checkpoint's is a :class:`HierarchyCollector` (the manager and the worker in every game)."""
        if self.manager is None:
            return Collector(self.actor, envs, env_id=env_id, settings=self.settings, best_of=best_of, scorer=scorer)
        if best_of > 1:
            raise ValueError(f"Expected best_of 1 for the hierarchical checkpoint {self.label}, got {best_of}: "
                             "best-of-n scores a single actor's candidate turns; drop --best_of")
        return HierarchyCollector(envs, env_id=env_id, settings=self.settings, manager=self.manager,
                                  worker=self.actor, hierarchy=self.config.hierarchy)


def hierarchy_dirs(spec: PolicySpec) -> tuple[Path, Path]:
    """A hierarchical checkpoint's manager and worker actor directories (``actor/`` and ``roles/worker/actor/``,
    as training saves them); a ``FileNotFoundError`` that names the one missing and the fix."""
    assert spec.actor_dir is not None
    manager = spec.actor_dir
    worker = manager.parent / "roles" / "worker" / "actor"
    for role, d in (("manager", manager), ("worker", worker)):
        if not ((d / "config.json").is_file() or (d / "adapter_config.json").is_file()):
            raise FileNotFoundError(
                f"Expected the {role}'s actor in {d} (its config.yaml sets hierarchy:, so the checkpoint holds a "
                f"manager in actor/ and a worker in roles/worker/actor/, as polyturn train saves them), found none; "
                "pass a whole checkpoint directory of a hierarchical run")
    return manager, worker


def _load(actor_dir: Path) -> Actor:
    try:
        actor = load_actor(actor_dir)
    except (OSError, ValueError, KeyError) as e:  # transformers' errors for a directory that is not a saved model
        raise ValueError(f"Expected a loadable actor in {actor_dir} (saved by polyturn train), "
                         f"got one that fails to load: {e}") from None
    actor = actor.to(Runtime.from_config("auto", "fp32"))  # a GPU when there is one
    actor.model.eval()
    return actor


def load_checkpoint(policy: str | Path | PolicySpec) -> LoadedCheckpoint:
    """Load the actor (in eval mode) and config of a checkpoint, actor or run directory (both policies of a
    hierarchical checkpoint).

    ``policy`` is a path (resolved by :func:`polyturn.acting.policies.resolve_policy`)
    or an already resolved :class:`PolicySpec` of kind ``actor``.
    """
    spec = policy if isinstance(policy, PolicySpec) else resolve_policy(str(policy))
    if spec.kind != "actor" or spec.actor_dir is None or spec.config is None:
        raise ValueError(f"Expected a checkpoint directory, got the built-in policy {spec.label!r}")
    if spec.config.hierarchy is None:
        return LoadedCheckpoint(label=spec.label, actor_dir=spec.actor_dir, actor=_load(spec.actor_dir),
                                config=spec.config)
    manager_dir, worker_dir = hierarchy_dirs(spec)
    return LoadedCheckpoint(label=spec.label, actor_dir=worker_dir, actor=_load(worker_dir), config=spec.config,
                            manager=_load(manager_dir))


def held_out_tasks(cfg: TrainConfig, n: int) -> list[dict[str, Any]]:
    """``n`` held-out tasks (seeds from ``env.eval_seed_start``, never trained on), default reset options."""
    return [{"seed": cfg.env.eval_seed_start + k, "options": {}} for k in range(n)]


def run_actor(
    source: LoadedCheckpoint | Collector | HierarchyCollector,
    tasks: Sequence[Mapping[str, Any]],
    *,
    temperature: float,
    seed: int,
    label: str | None = None,
    progress: Callable[[int], None] | None = None,
    env_id: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    num_envs: int = 16,
) -> list[Episode]:
    """Play every task (``{"seed", "options"}``) to its end with an actor; episodes come back in task order.

    Args:
        source: a loaded checkpoint, or a live collector (its actor and environments are used as they are; a
            :class:`HierarchyCollector` returns the worker's episodes).
        tasks: what :meth:`Collector.collect` takes.
        temperature: 0 decodes greedily; above 0 samples.
        seed: seeds the sampling generator (the same seed and tasks give the same episodes).
        label: the episodes' ``policy`` (default: the checkpoint's label, or ``"actor"``).
        progress: called with the number of episodes just finished.
        env_id: for a checkpoint, the environment (default: its config's ``env.id``).
        env_kwargs: for a checkpoint, ``gymnasium.make`` keyword arguments (default: its config's
            ``env.kwargs``).
        num_envs: for a checkpoint, how many conversations run in one batch (at most one per task).
    """
    if temperature < 0:
        raise ValueError(f"Expected temperature >= 0, got {temperature}")
    if num_envs < 1:
        raise ValueError(f"Expected num_envs >= 1, got {num_envs}")
    generator = torch.Generator(device=source.actor.device).manual_seed(seed)  # sampling draws on the actor's device
    if not isinstance(source, LoadedCheckpoint):
        source.actor.model.eval()
        return source.collect(tasks, temperature=temperature, generator=generator, progress=progress,
                              policy=label or "actor")
    cfg = source.config
    env_id = env_id or cfg.env.id
    kwargs = cfg.env.kwargs if env_kwargs is None else env_kwargs
    envs = []
    try:
        for _ in range(max(1, min(num_envs, len(tasks)))):
            envs.append(make_env(env_id, kwargs).unwrapped)
        return run_actor(source.collector(envs, env_id=env_id), tasks, temperature=temperature, seed=seed,
                         label=label or source.label, progress=progress)
    finally:
        for e in envs:
            e.close()
