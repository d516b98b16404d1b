"""Text environments for multi-turn tool use (never imports torch).

Each environment package declares its :class:`~polyturn.envs.spec.EnvSpec` in
its ``spec.py``; :mod:`polyturn.acting.registry` finds and registers them
(``import polyturn`` does), with third-party specs from the ``polyturn.envs``
entry-point group.
"""

from polyturn.envs.actions import FormatError, ToolCall, format_action, parse_action
from polyturn.envs.base import BadArgs, EpisodeStart, ToolEnv, ToolResult
from polyturn.envs.rewards import RewardWeights
from polyturn.envs.spaces import TextSpace
from polyturn.envs.spec import EnvMetric, EnvSpec

__all__ = [
    "BadArgs",
    "EnvMetric",
    "EnvSpec",
    "EpisodeStart",
    "FormatError",
    "RewardWeights",
    "TextSpace",
    "ToolCall",
    "ToolEnv",
    "ToolResult",
    "format_action",
    "parse_action",
]
