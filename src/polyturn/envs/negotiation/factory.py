"""The entry point of ``polyturn/Negotiation-v0``: ``opponent`` picks the scripted game or self-play."""

from __future__ import annotations

from typing import Any, Literal

import gymnasium

from polyturn.envs.negotiation.env import NegotiationEnv
from polyturn.envs.negotiation.selfplay import NegotiationSelfPlayEnv

OPPONENTS = ("scripted", "self")


def make_negotiation_env(*, opponent: Literal["scripted", "self"] = "scripted", **kwargs: Any) -> gymnasium.Env:
    """``NegotiationEnv(**kwargs)`` against a scripted opponent (the default), or with ``opponent="self"``
    the two-role :class:`NegotiationSelfPlayEnv` (which takes no ``level``: levels pick a scripted strategy)."""
    if opponent == "scripted":
        return NegotiationEnv(**kwargs)
    if opponent != "self":
        raise ValueError(f"Expected opponent among {OPPONENTS}, got {opponent!r}")
    if kwargs.get("level") is not None:
        raise ValueError(f"Expected no level with opponent='self' (a level picks the scripted opponent's "
                         f"strategy; in self-play both sides are players), got level={kwargs['level']!r}")
    kwargs.pop("level", None)
    return NegotiationSelfPlayEnv(**kwargs)
