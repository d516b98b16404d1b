"""The simulated user: wants one meeting (who, which day, how long) and says only what the request left out when asked."""

from __future__ import annotations

import re
from dataclasses import dataclass

from meeting_booking.calendar import hhmm

_DAY_WORDS = re.compile(r"\b(day|when|date|which)\b", re.IGNORECASE)
_LENGTH_WORDS = re.compile(r"\b(long|length|duration|minutes?|hours?)\b", re.IGNORECASE)
DAY_NAMES = {"Mon": "Monday", "Tue": "Tuesday", "Wed": "Wednesday", "Thu": "Thursday", "Fri": "Friday"}


@dataclass(frozen=True)
class Goal:
    """What the user wants; ``says_day`` / ``says_length`` whether the first request states it."""

    person: str
    day: str
    minutes: int
    says_day: bool
    says_length: bool

    def request(self) -> str:
        """The user's first message."""
        length = f"a {self.minutes}-minute meeting" if self.says_length else "a meeting"
        day = f" on {DAY_NAMES[self.day]}" if self.says_day else " this week"
        return f"Please book {length} with {self.person}{day}."

    def privileged(self, free: list[tuple[int, int]]) -> str:
        """The hidden goal and the free windows, for the critic (never shown to the agent)."""
        windows = ", ".join(f"{hhmm(s)}-{hhmm(e)}" for s, e in free)
        return f"Goal: {self.minutes} minutes with {self.person} on {self.day}. Free for both: {windows}."


def reply(goal: Goal, question: str) -> tuple[str, list[str]]:
    """The user's answer to ``question`` and what it revealed (``day`` / ``length``, empty: nothing new)."""
    asked_day, asked_length = bool(_DAY_WORDS.search(question)), bool(_LENGTH_WORDS.search(question))
    parts, revealed = [], []
    if asked_day:
        parts.append(f"{DAY_NAMES[goal.day]} works for me.")
        revealed += [] if goal.says_day else ["day"]
    if asked_length:
        parts.append(f"{goal.minutes} minutes is enough.")
        revealed += [] if goal.says_length else ["length"]
    if not parts:
        return "Sorry, I don't follow. You can ask me which day or how long.", []
    return " ".join(parts), revealed
