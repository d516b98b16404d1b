"""Text environments for multi-turn tool use (never imports torch).

Importing this package registers every env id with gymnasium
(``polyturn/SQLAnalyst-v0``); see :mod:`polyturn.envs.registration`.
"""

from polyturn.envs.actions import FormatError, ToolCall, format_action, parse_action
from polyturn.envs.base import BadArgs, EpisodeStart, ToolEnv, ToolResult
from polyturn.envs.registration import ENTRY_POINTS, register_envs
from polyturn.envs.rewards import RewardWeights
from polyturn.envs.spaces import TextSpace

register_envs()

ENV_IDS: tuple[str, ...] = tuple(ENTRY_POINTS)

__all__ = [
    "ENV_IDS",
    "BadArgs",
    "EpisodeStart",
    "FormatError",
    "RewardWeights",
    "TextSpace",
    "ToolCall",
    "ToolEnv",
    "ToolResult",
    "format_action",
    "parse_action",
    "register_envs",
]
