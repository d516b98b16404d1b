"""A saved checkpoint's critic on episodes: what ``polyturn diagnose``'s critic check compares with returns."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from polyturn.config import TrainConfig
from polyturn.models.actor import Actor
from polyturn.models.critic import SeparateCritic
from polyturn.rollout.types import Episode
from polyturn.train.batch import make_token_batch
from polyturn.train.critics import SeparateLearner, SharedLearner


def critic_values(ckpt: Path, cfg: TrainConfig, actor: Actor,
                  eps: Sequence[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, next_values)``, each ``[E, T]``, of the critic saved in ``ckpt`` (``separate`` or ``shared``)."""
    if cfg.critic.kind == "separate":
        if not (ckpt / "critic").is_dir():
            raise FileNotFoundError(f"Expected the separate critic in {ckpt / 'critic'}, found none")
        learner: Any = SeparateLearner(SeparateCritic.from_pretrained(ckpt / "critic"), cfg.critic)
        return learner.values(eps)
    learner = SharedLearner(actor, cfg.critic)
    learner.load(ckpt)
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=actor.pad_id)
    return learner.values(eps, batch)
