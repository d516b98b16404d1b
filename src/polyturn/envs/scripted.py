"""The loop a scripted expert runs: a generator script fed one observation per turn, one planted format error."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

Script = Generator[str, str, None]


class ScriptedExpert:
    """Base of experts written as a generator script (``reset`` builds ``self._script``; ``act`` drives it).

    The script yields an action and receives the next observation. At ``self._broken_step`` (-1: never) the
    action is sent with its bracket dropped (a format error) and sent again, intact, on the next turn.
    Subclasses set ``_script``, ``_started``, ``_held``, ``_step`` and ``_broken_step`` in ``reset`` and name
    the tool that ends an episode in ``END_TOOL``.
    """

    END_TOOL = "the final tool"
    _script: Script | None
    _started: bool
    _held: str | None
    _step: int
    _broken_step: int

    def act(self, obs: str, info: Mapping[str, Any]) -> str:
        """The next action text, given the latest observation."""
        if self._script is None:
            raise RuntimeError("Expected reset(obs, info) before act(), got act() first")
        if self._held is not None:
            action, self._held = self._held, None
            return action
        try:
            action = self._script.send(obs) if self._started else next(self._script)
        except StopIteration:
            raise RuntimeError(f"Expected the episode to end at {self.END_TOOL}, got act() after it") from None
        self._started = True
        if self._step == self._broken_step:
            self._held = action
            action = action.replace("[", " ", 1)  # drops the bracket: a format error
        self._step += 1
        return action
