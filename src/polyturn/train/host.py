"""What the trainer's helpers read of the :class:`~polyturn.train.trainer.Trainer` that drives them.

The policy updates (:mod:`polyturn.train.algorithms`, :mod:`polyturn.train.turn_dpo`)
and the Ray collection (:mod:`polyturn.train.remote`) are handed the trainer. They
are typed against this protocol, so none of them imports the trainer module that
imports them (the dependency runs one way: trainer -> helpers -> this module).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import torch

from polyturn.config import TrainConfig
from polyturn.models.actor import Actor
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.types import Episode, Segment
from polyturn.runtime import Runtime
from polyturn.train.batch import MicroStats, TokenBatch


class TrainerHost(Protocol):
    """The trainer's attributes and steps its helpers use."""

    cfg: TrainConfig
    actor: Actor
    actor_opt: torch.optim.Optimizer
    ref_actor: Actor | None
    critic: Any  # a polyturn.train.critics.CriticLearner (score_candidates for the action critic)
    runtime: Runtime
    settings: RolloutSettings
    state: dict[str, Any]
    gen: torch.Generator
    py_rng: random.Random
    _demo_items: list[list[Segment]]

    @property
    def rl_total(self) -> int: ...

    def next_tasks(self, n: int, progress: float) -> list[dict]: ...

    def update_actor(self, episodes: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
                     old_values: torch.Tensor, *, temperature: float, ent_coef: float, w_bc: float,
                     w_rl: float, negatives: tuple[Sequence[Episode], torch.Tensor] | None = None) -> dict[str, float]: ...

    def _actor_lr_factor(self) -> float: ...

    def _ref_logprobs(self, batch: TokenBatch, temperature: float) -> torch.Tensor: ...

    def _bc_batch_loss(self, idx: Sequence[int], acc: MicroStats, *,
                       weight: float = 1.0) -> Iterator[torch.Tensor]: ...

    def _guarded_step(self, loss: torch.Tensor | Iterable[torch.Tensor], opt: torch.optim.Optimizer, params: list,
                      max_norm: float, *, where: str, extra_opt: torch.optim.Optimizer | None = None,
                      proceed: Callable[[], bool] | None = None) -> tuple[bool | None, float]: ...
