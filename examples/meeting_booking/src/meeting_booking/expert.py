"""The scripted expert of ``meeting/MeetingBooking-v0``, exact or noisy; it reads only the observations.

It asks for whatever the request left out (the day, the length), checks the
calendar and books the first window long enough. :class:`MeetingNoise` sets
the probability of each mistake per episode: not asking (guessing Monday or 30
minutes), booking without checking (at 09:00), and one malformed action.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from polyturn.envs.actions import format_action
from polyturn.envs.noise import MistakeRates
from polyturn.envs.scripted import Script, ScriptedExpert

from meeting_booking.calendar import DAYS, parse_hhmm

_DAY = re.compile(r"\b(Mon|Tue|Wed|Thu|Fri)[a-z]*\b")
_MINUTES = re.compile(r"\b(\d+)[- ]minute")
_WINDOW = re.compile(r"(\d\d:\d\d)-(\d\d:\d\d)")


class MeetingNoise(MistakeRates):
    """Probabilities of the expert's mistakes, per episode (all 0: the exact expert)."""

    skip_ask: float = Field(0.0, ge=0, le=1, description="Guess what the request left out instead of asking.")
    skip_check: float = Field(0.0, ge=0, le=1, description="Book at 09:00 without checking the calendar.")
    format_error: float = Field(0.0, ge=0, le=1, description="One malformed action, sent again intact next turn.")


class MeetingExpert(ScriptedExpert):
    """``reset(obs, info)``, then ``act(obs, info) -> str`` (polyturn's :class:`ScriptedExpert` protocol).

    Args:
        env: the environment (the expert reads nothing from it but the observations).
        noise: a :class:`MeetingNoise`, or one probability for every mistake.
        seed: seeds the mistakes.
    """

    NOISE = MeetingNoise
    RNG_NAME = "meeting-expert"
    END_TOOL = "book_meeting"

    def _plan(self, obs: str, info: Mapping[str, Any]) -> None:
        """Draw the episode's mistakes (in field order) and script it from the user's request."""
        chance = {k: self._chance(k) for k in MeetingNoise.model_fields}
        self._script = self._run(obs, chance)
        self._broken_step = self.rng.randrange(3) if chance["format_error"] else -1

    def _run(self, request: str, chance: dict[str, bool]) -> Script:
        person = request.split(" with ", 1)[1].split(" ", 1)[0].rstrip(".")
        day_m, len_m = _DAY.search(request), _MINUTES.search(request)
        day = day_m.group(1) if day_m else None
        minutes = int(len_m.group(1)) if len_m else None
        if day is None or minutes is None:
            if chance["skip_ask"]:
                day, minutes = day or DAYS[0], minutes or 30
            else:
                what = " and ".join(w for w, missing in (("which day", day is None), ("how long", minutes is None))
                                    if missing)
                answer = yield format_action("ask_user", {"question": f"Sure. Could you tell me {what} the meeting "
                                                                      f"should be?"}, "The request leaves it open.")
                said = _DAY.search(answer)
                day = day or (said.group(1) if said else DAYS[0])
                found = re.search(r"(\d+) minutes", answer)
                minutes = minutes or (int(found.group(1)) if found else 30)
        start = "09:00"
        if not chance["skip_check"]:
            free = yield format_action("check_calendar", {"person": person, "day": day}, "Find a common free window.")
            fits = [s for s, e in _WINDOW.findall(free) if parse_hhmm(e) - parse_hhmm(s) >= minutes]
            start = fits[0] if fits else start
        yield format_action("book_meeting", {"person": person, "day": day, "start": start, "minutes": minutes},
                            "Book the first window that fits.")
