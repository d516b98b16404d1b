"""The calendar: people's busy blocks per weekday, free-slot search and booking (in memory).

Times are minutes since midnight; the working day is 09:00-17:00 and
meetings start on the half hour. A calendar comes from a seed (random busy
blocks) or from a JSON file (``--data-dir`` in ``polyturn serve``)::

    {"people": {"Dana": [["Tue", "09:00", "10:30"], ...], "me": [...]}}

``me`` is the user the assistant books for.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri")
PEOPLE = ("Alice", "Bruno", "Chen", "Dana", "Emeka", "Fatima", "Goran", "Hana")
ME = "me"
DAY_START, DAY_END, STEP = 9 * 60, 17 * 60, 30


def hhmm(minutes: int) -> str:
    """``600 -> "10:00"``."""
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def parse_hhmm(text: str) -> int:
    """``"10:00" -> 600``; ``ValueError`` for anything else."""
    h, sep, m = str(text).strip().partition(":")
    if not sep or not h.isdigit() or not m.isdigit() or len(m) != 2 or int(h) > 23 or int(m) > 59:
        raise ValueError(f"Expected a time HH:MM, got {text!r}")
    return int(h) * 60 + int(m)


@dataclass
class Meeting:
    """A booked meeting."""

    person: str
    day: str
    start: int
    minutes: int

    @property
    def end(self) -> int:
        return self.start + self.minutes


@dataclass
class Calendar:
    """Busy blocks ``(start, end)`` per person and day, and the meetings booked in it."""

    busy: dict[str, dict[str, list[tuple[int, int]]]]
    booked: list[Meeting] = field(default_factory=list)

    @classmethod
    def random(cls, rng: random.Random, people: tuple[str, ...] = PEOPLE) -> Calendar:
        """Two to four busy blocks of 30-120 minutes per person and day."""
        busy: dict[str, dict[str, list[tuple[int, int]]]] = {}
        for person in (ME, *people):
            busy[person] = {}
            for day in DAYS:
                blocks = []
                for _ in range(rng.randint(2, 4)):
                    start = DAY_START + STEP * rng.randrange((DAY_END - DAY_START) // STEP)
                    blocks.append((start, min(DAY_END, start + STEP * rng.randint(1, 4))))
                busy[person][day] = merge(blocks)
        return cls(busy)

    @classmethod
    def from_file(cls, path: str | Path) -> Calendar:
        """A calendar file (see the module docstring); ``ValueError`` naming what is wrong."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        people = data.get("people") if isinstance(data, dict) else None
        if not isinstance(people, dict) or ME not in people or len(people) < 2:
            raise ValueError(f'Expected {{"people": {{"me": [...], "<name>": [...]}}}} in {path}, got another shape')
        busy: dict[str, dict[str, list[tuple[int, int]]]] = {}
        for person, blocks in people.items():
            busy[person] = {d: [] for d in DAYS}
            for block in blocks:
                if not (isinstance(block, list) and len(block) == 3 and block[0] in DAYS):
                    raise ValueError(f"Expected [day, 'HH:MM', 'HH:MM'] with day in {DAYS}, got {block!r}")
                busy[person][block[0]].append((parse_hhmm(block[1]), parse_hhmm(block[2])))
            busy[person] = {d: merge(b) for d, b in busy[person].items()}
        return cls(busy)

    @property
    def people(self) -> list[str]:
        """Everyone but ``me``."""
        return [p for p in self.busy if p != ME]

    def free(self, person: str, day: str, minutes: int) -> list[tuple[int, int]]:
        """Windows of at least ``minutes`` when both ``me`` and ``person`` are free on ``day``."""
        blocks = merge(self.busy[ME][day] + self.busy[person][day])
        out, t = [], DAY_START
        for start, end in blocks + [(DAY_END, DAY_END)]:
            if start - t >= minutes:
                out.append((t, start))
            t = max(t, end)
        return out

    def book(self, meeting: Meeting) -> list[str]:
        """Add the meeting; returns who it clashes with (empty: a clean booking)."""
        self.booked.append(meeting)
        return [who for who in (ME, meeting.person)
                if any(s < meeting.end and meeting.start < e for s, e in self.busy[who][meeting.day])]


def merge(blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping blocks merged."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(blocks):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out
