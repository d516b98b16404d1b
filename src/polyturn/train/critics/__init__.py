"""The critic kinds (config ``critic.kind``), one learner class each, behind one interface (:class:`CriticLearner`).

| kind | learner | what |
|---|---|---|
| ``separate`` | :class:`SeparateLearner` | the asymmetric critic: its own model, tokenizer and optimizer; reads the state as text, plus privileged text when configured |
| ``shared`` | :class:`SharedLearner` | a value head on the actor's hidden states (the symmetric baseline) |
| ``none`` | :class:`NoCritic` | values are zero; the group-relative baseline over episodes of the same task |
| ``action`` | :class:`ActionLearner` | scores turns; trained with a Bradley-Terry loss on pairs of episodes |

Each class checks the settings it cannot run (:meth:`CriticLearner.check`) and builds itself from a config
(:meth:`CriticLearner.build`), so the trainer never asks which kind it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyturn.config import TrainConfig
from polyturn.models.actor import Actor
from polyturn.train.critics.action import ActionLearner
from polyturn.train.critics.base import (CriticLearner, bootstraps, episode_advantages, state_input, turn_discounts,
                                         turn_duration, turn_tensors)
from polyturn.train.critics.none import NoCritic
from polyturn.train.critics.separate import SeparateLearner, encoded_rows
from polyturn.train.critics.shared import SharedLearner, state_positions, values_from_hidden

#: Every critic kind by its ``critic.kind`` name.
CRITICS: dict[str, type[CriticLearner]] = {"separate": SeparateLearner, "shared": SharedLearner, "none": NoCritic,
                                           "action": ActionLearner}

__all__ = ["CRITICS", "ActionLearner", "CriticLearner", "NoCritic", "SeparateLearner", "SharedLearner", "bootstraps",
           "build_critic", "check_critic", "encoded_rows", "episode_advantages", "state_input", "state_positions",
           "turn_discounts", "turn_duration", "turn_tensors", "values_from_hidden"]


def check_critic(cfg: TrainConfig, *, world_size: int = 1) -> None:
    """``ValueError`` when ``cfg.critic.kind`` cannot run the rest of ``cfg`` (see each kind's ``check``)."""
    CRITICS[cfg.critic.kind].check(cfg, world_size=world_size)


def build_critic(cfg: TrainConfig, demos: Sequence[dict], actor: Actor,
                 feature_names: Sequence[str] | None) -> CriticLearner:
    """The configured critic learner, for a run on ``demos`` beside ``actor``."""
    return CRITICS[cfg.critic.kind].build(cfg, demos=demos, actor=actor, feature_names=feature_names)
