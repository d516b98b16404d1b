"""Typed training configuration: YAML in, validated objects out.

Every section is a pydantic model with ``extra="forbid"``, so a misspelt key
or a bad value fails at load with an error that names the field, the value
and what is allowed (:class:`ConfigError`). ``polyturn train --set a.b=v``
overrides any field. The resolved config is saved next to every checkpoint.

One module per part of a run: :mod:`~polyturn.config.run` (``run``, ``env``), :mod:`~polyturn.config.models`
(``actor``, ``critic``), :mod:`~polyturn.config.updates` (``bc``, ``ppo``), :mod:`~polyturn.config.curriculum`,
:mod:`~polyturn.config.rollout` (``rollout``, ``selfplay``, ``hierarchy``), :mod:`~polyturn.config.objectives`
(``constraints``, ``offline``, ``judge``) and :mod:`~polyturn.config.train` (the whole config, loading and saving).
Import from here.
"""

from polyturn.config._base import ConfigError, GroupShares
from polyturn.config.curriculum import CurriculumConfig, Schedule, Stage
from polyturn.config.models import ActorConfig, CriticConfig, LoraConfig
from polyturn.config.objectives import ConstraintsConfig, CostCriticConfig, JudgeConfig, OfflineConfig
from polyturn.config.rollout import HierarchyConfig, PartnerMix, RolloutConfig, SelfPlayConfig
from polyturn.config.run import EnvConfig, RunConfig
from polyturn.config.train import FIX_MISSING, TrainConfig, load_config, parse_overrides, save_config
from polyturn.config.updates import ACTION_ALGOS, BCConfig, PPOConfig, RefusalPairsConfig

__all__ = [
    "ACTION_ALGOS", "FIX_MISSING", "ActorConfig", "BCConfig", "ConfigError", "ConstraintsConfig", "CostCriticConfig",
    "CriticConfig", "CurriculumConfig", "EnvConfig", "GroupShares", "HierarchyConfig", "JudgeConfig", "LoraConfig",
    "OfflineConfig", "PPOConfig", "PartnerMix", "RefusalPairsConfig", "RolloutConfig", "RunConfig", "Schedule",
    "SelfPlayConfig", "Stage", "TrainConfig", "load_config", "parse_overrides", "save_config",
]
