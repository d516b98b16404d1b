"""``critic.kind: none``: no critic; the group-relative baseline over episodes of the same task (GRPO/RLOO)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polyturn.config import TrainConfig
from polyturn.models.actor import Actor
from polyturn.rollout.types import Episode
from polyturn.train.critics.base import CriticLearner, episode_advantages


class NoCritic(CriticLearner):
    """``critic.kind: none``: group-relative advantages over ``group_size`` episodes per task instead of values."""

    def __init__(self, *, group_size: int = 4) -> None:
        self.group_size = group_size

    @classmethod
    def build(cls, cfg: TrainConfig, *, demos: Sequence[dict], actor: Actor,
              feature_names: Sequence[str] | None) -> CriticLearner:
        return cls(group_size=cfg.critic.group_size)

    @property
    def task_group(self) -> int:
        return self.group_size

    @property
    def has_values(self) -> bool:
        return False

    def advantages(self, episodes: Sequence[Episode], tt: dict[str, torch.Tensor], values: torch.Tensor,
                   next_values: torch.Tensor, *, gamma: float, lam: float,
                   reward_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Each episode's return minus its task group's mean (every turn shares it); returns are reward-to-go."""
        adv = episode_advantages(episodes, reward_scale)[:, None] * tt["mask"]
        return adv, tt["rewards"].flip(1).cumsum(1).flip(1) * tt["mask"]
