"""``MeetingBookingEnv``: book one meeting for a user whose request may leave out the day or the length.

Tools (ReAct actions, :class:`polyturn.envs.ToolEnv`):

* ``ask_user[{"question": ...}]`` — the simulated user answers which day or how long
  (:mod:`meeting_booking.user`);
* ``check_calendar[{"person": ..., "day": "Tue"}]`` — the windows when both the user and
  ``person`` are free that day;
* ``book_meeting[{"person": ..., "day": ..., "start": "HH:MM", "minutes": 30}]`` — books it
  and ends the episode.

Success is judged on the final calendar, not on what the agent says: exactly
the meeting the user wanted (person, day, length) and no clash with anyone's
busy time. Reward terms: polyturn's generic ones plus ``subgoal/clarified``
(:class:`MeetingBookingWeights`). Levels: 1 the request says everything,
2 it leaves out the day, 3 the day and the length. The privileged text (for the
critic) is the hidden goal and the free windows.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from polyturn.envs import BadArgs, EpisodeStart, RewardWeights, ToolEnv, ToolResult
from polyturn.envs.base import check_levels, require_str

from meeting_booking.calendar import DAYS, Calendar, Meeting, hhmm, parse_hhmm
from meeting_booking.user import Goal, reply

LEVELS = (1, 2, 3)
LENGTHS = (30, 60, 90)
FEATURES = ("asked", "checked", "booked", "clash")
TOOL_HELP = {
    "ask_user": 'ask_user[{"question": "..."}]: ask the user, e.g. which day or how long. Returns their answer.',
    "check_calendar": 'check_calendar[{"person": "Dana", "day": "Tue"}]: when you and that person are both free.',
    "book_meeting": 'book_meeting[{"person": "Dana", "day": "Tue", "start": "10:00", "minutes": 30}]: book it '
                    "(ends the task).",
}


class MeetingBookingWeights(RewardWeights):
    """polyturn's generic reward weights plus this env's one sub-goal."""

    subgoal_clarified: float = Field(0.2, ge=0, description="Every detail the request left out learnt from the user.")


class MeetingBookingEnv(ToolEnv):
    """The meeting-booking assistant's environment (see the module docstring).

    Args:
        level: default level(s), 1-3 (all by default).
        max_turns: turns before truncation.
        calendar_path: a calendar JSON file (:mod:`meeting_booking.calendar`); default: a random calendar per task.
        reward_weights: overrides of the default weights (:class:`MeetingBookingWeights`).
        render_mode: ``None`` or ``"ansi"``.
    """

    weights_class = MeetingBookingWeights
    explore_tools = ("ask_user", "check_calendar")

    def __init__(self, *, level: int | Sequence[int] | None = None, max_turns: int = 6,
                 calendar_path: str | None = None, reward_weights: RewardWeights | Mapping[str, float] | None = None,
                 render_mode: str | None = None) -> None:
        super().__init__(max_turns=max_turns, reward_weights=reward_weights, render_mode=render_mode)
        self.levels = check_levels(LEVELS if level is None else level, LEVELS)
        self.fixed = Calendar.from_file(calendar_path) if calendar_path is not None else None
        self.tools |= {"ask_user": self._ask_user, "check_calendar": self._check_calendar,
                       "book_meeting": self._book_meeting}
        self.tools = {k: self.tools[k] for k in ("ask_user", "check_calendar", "book_meeting", "remember")}
        self.tool_help |= TOOL_HELP
        self.calendar = Calendar({})
        self.goal: Goal | None = None
        self._flags = dict.fromkeys(FEATURES, 0.0)

    def _new_task(self, seed: int, options: Mapping[str, Any]) -> EpisodeStart:
        if options.get("task_id") is not None:
            raise ValueError(f"Expected no task_id (tasks come from the seed), got {options['task_id']!r}")
        levels = self.levels if options.get("level") is None else check_levels(options["level"], LEVELS)
        rng = random.Random(f"meeting-{seed}")
        level = levels[rng.randrange(len(levels))]
        calendar = Calendar({p: {d: list(b) for d, b in days.items()} for p, days in self.fixed.busy.items()}) \
            if self.fixed is not None else Calendar.random(rng)
        while True:  # a goal with a free window for it
            person, day = rng.choice(calendar.people), rng.choice(DAYS)
            minutes = rng.choice(LENGTHS)
            if calendar.free(person, day, minutes):
                break
        self.calendar = calendar
        self.goal = Goal(person=person, day=day, minutes=minutes, says_day=level < 2, says_length=level < 3)
        self._flags = dict.fromkeys(FEATURES, 0.0)
        keys = ("check_calendar", "book_meeting") if level == 1 else ("ask_user", "check_calendar", "book_meeting")
        return EpisodeStart(task_id=f"meet-{person}-{day}-{minutes}-L{level}", question=self.goal.request(),
                            level=level, ambiguous=level > 1,
                            privileged=self.goal.privileged(calendar.free(person, day, minutes)), key_actions=keys)

    def _task_features(self) -> dict[str, float]:
        return dict(self._flags)

    def tool_docs(self) -> str:
        """The task, the action format and the tools."""
        return "You book meetings in the user's calendar.\n" + super().tool_docs()

    # ----- tools ------------------------------------------------------------------------------
    def _person(self, args: Mapping[str, Any]) -> str:
        person = require_str(args, "person", max_len=40).strip()
        if person not in self.calendar.people:
            raise BadArgs(f"Expected a person among {self.calendar.people}, got {person!r}")
        return person

    @staticmethod
    def _day(args: Mapping[str, Any]) -> str:
        day = require_str(args, "day", max_len=12).strip()[:3].title()
        if day not in DAYS:
            raise BadArgs(f"Expected a day among {list(DAYS)}, got {args.get('day')!r}")
        return day

    def _ask_user(self, args: dict[str, Any]) -> ToolResult:
        assert self.goal is not None
        answer, revealed = reply(self.goal, require_str(args, "question", max_len=300))
        self._flags["asked"] = 1.0
        if revealed and not (set(revealed) - {"day", "length"}):
            if (self.goal.says_day or "day" in revealed) and (self.goal.says_length or "length" in revealed):
                self.achieve("clarified")
        return ToolResult(f"User: {answer}", credit=bool(revealed))

    def _check_calendar(self, args: dict[str, Any]) -> ToolResult:
        assert self.goal is not None
        person, day = self._person(args), self._day(args)
        self._flags["checked"] = 1.0
        windows = self.calendar.free(person, day, 30)
        text = ", ".join(f"{hhmm(s)}-{hhmm(e)}" for s, e in windows) or "no common free time"
        return ToolResult(f"You and {person} are both free on {day}: {text}.")

    def _book_meeting(self, args: dict[str, Any]) -> ToolResult:
        assert self.goal is not None
        person, day = self._person(args), self._day(args)
        try:
            start = parse_hhmm(args.get("start", ""))
        except ValueError as e:
            raise BadArgs(str(e)) from None
        minutes = args.get("minutes")
        if not isinstance(minutes, int) or isinstance(minutes, bool) or not 15 <= minutes <= 240:
            raise BadArgs(f"Expected minutes as an integer in [15, 240], got {minutes!r}")
        meeting = Meeting(person=person, day=day, start=start, minutes=minutes)
        clashes = self.calendar.book(meeting)
        self._flags["booked"] = 1.0
        self._flags["clash"] = float(bool(clashes))
        g = self.goal
        success = not clashes and (person, day, minutes) == (g.person, g.day, g.minutes)
        when = f"{day} {hhmm(start)}-{hhmm(meeting.end)}"
        note = f" It clashes with busy time of: {', '.join(clashes)}." if clashes else ""
        return ToolResult(f"Booked {minutes} minutes with {person} on {when}.{note}", done=True, success=success)

    def example_args(self, tool: str, rng: Any) -> dict[str, Any]:
        """A question about the day or length, or a calendar look-up of a random person and day."""
        if tool == "ask_user":
            return {"question": ("Which day works for you?", "How long should it be?")[int(rng.integers(2))]}
        if tool == "check_calendar":
            people = self.calendar.people
            return {"person": people[int(rng.integers(len(people)))], "day": DAYS[int(rng.integers(len(DAYS)))]}
        return super().example_args(tool, rng)
