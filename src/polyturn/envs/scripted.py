"""The one base of every scripted expert: seeded mistakes, one planted format error, a script or a decision rule.

An expert is built as ``cls(env, noise=..., seed=...)`` (``noise``: one probability for every mistake, or
the expert's :class:`~polyturn.envs.noise.MistakeRates` subclass), then ``reset(obs, info)`` at the start
of an episode and ``act(obs, info) -> str`` each turn. The base owns what all experts share:

* the per-episode RNG, seeded by the expert's ``RNG_NAME``, its seed, the episode count and the task id,
  so an episode's mistakes depend on nothing else (drawn in :meth:`ScriptedExpert._plan`, in the order
  each expert documents);
* the planted format error: at step ``_broken_step`` (-1: never) the action goes out with its bracket
  dropped and is sent again, intact, on the next turn (:meth:`ScriptedExpert._flaw` may plant another);
* the action source: by default a generator script (``_script``, built in ``_plan``) that yields an action
  and receives the next observation; an expert with a decision rule overrides :meth:`ScriptedExpert._next`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping
from typing import Any, ClassVar

import gymnasium

from polyturn.envs.noise import MistakeRates

Script = Generator[str, str, None]


class ScriptedExpert(ABC):
    """Base of the scripted experts (see the module docstring).

    Args:
        env: the env (or a wrapper of it); experts read observations and the env's public state only.
        noise: an instance of the expert's ``NOISE`` class, or one probability for every mistake.
        seed: seeds the mistakes; episodes are reproducible for a given seed and order.

    A subclass sets ``NOISE`` (its mistake kinds), ``RNG_NAME`` (the per-episode seed's prefix; changing
    it changes every demonstration) and ``END_TOOL``, and implements ``_plan``.
    """

    NOISE: ClassVar[type[MistakeRates]]
    RNG_NAME: ClassVar[str]
    END_TOOL: ClassVar[str] = "the final tool"

    def __init__(self, env: gymnasium.Env, *, noise: float | MistakeRates = 0.0, seed: int = 0) -> None:
        self.env = env.unwrapped
        self.noise = self.NOISE.coerce(noise)
        self.name = self.noise.label()
        self.seed = seed
        self.rng = random.Random(seed)
        self._episodes = 0
        self._script: Script | None = None
        self._started = False
        self._held: str | None = None
        self._step = 0
        self._broken_step = -1

    def reset(self, obs: str, info: Mapping[str, Any]) -> None:
        """Start a new episode: a fresh RNG, then the expert's plan (its mistakes, its script)."""
        self.rng = random.Random(f"{self.RNG_NAME}-{self.seed}-{self._episodes}-{info.get('task_id')}")
        self._episodes += 1
        self._script = None
        self._started = False
        self._held = None
        self._step = 0
        self._broken_step = -1
        self._plan(obs, info)

    @abstractmethod
    def _plan(self, obs: str, info: Mapping[str, Any]) -> None:
        """Draw this episode's mistakes from ``self.rng`` (setting ``_broken_step``) and build ``_script``."""

    def act(self, obs: str, info: Mapping[str, Any]) -> str:
        """The next action text, given the latest observation."""
        if self._episodes == 0:
            raise RuntimeError("Expected reset(obs, info) before act(), got act() first")
        if self._held is not None:
            action, self._held = self._held, None
            return action
        action = self._next(obs, info)
        flawed = self._flaw(action)
        if flawed is not None:
            self._held, action = action, flawed
        self._step += 1
        return action

    def _next(self, obs: str, info: Mapping[str, Any]) -> str:
        """The intended action: the script's next one (an expert with a decision rule overrides this)."""
        assert self._script is not None, "_plan must build self._script or the expert must override _next"
        try:
            action = self._script.send(obs) if self._started else next(self._script)
        except StopIteration:
            raise RuntimeError(f"Expected the episode to end at {self.END_TOOL}, got act() after it") from None
        self._started = True
        return action

    def _flaw(self, action: str) -> str | None:
        """The flawed action to send instead of ``action`` at this step (held and resent next turn), or None."""
        if self._step == self._broken_step:
            return action.replace("[", " ", 1)  # drops the bracket: a format error
        return None

    def _chance(self, mistake: str) -> bool:
        """Draw whether this mistake happens (one ``rng.random()`` against its rate)."""
        return self.rng.random() < getattr(self.noise, mistake)
