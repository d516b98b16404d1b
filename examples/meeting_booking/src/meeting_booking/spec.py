"""The :class:`polyturn.envs.spec.EnvSpec` of ``meeting/MeetingBooking-v0``, named by this package's entry point."""

from __future__ import annotations

from polyturn.envs.spec import EnvMetric, EnvSpec, Subgoal, final_feature

SPEC = EnvSpec(
    id="meeting/MeetingBooking-v0",
    entry_point="meeting_booking.env:MeetingBookingEnv",
    expert="meeting_booking.expert:MeetingExpert",
    task_description="an AI scheduling assistant booking the meeting a user asks for by calling tools (ask_user, "
                     "check_calendar, book_meeting); booking exactly the meeting the user wanted, "
                     "without a clash, is what counts",
    action_types=("ask_user", "check_calendar", "book_meeting", "remember"),
    observation_kinds={"ask_user": "user_reply", "check_calendar": "free_windows"},
    final_action="book_meeting",
    final_noun="booking",
    metrics=(EnvMetric(name="clash_rate", title="Clashing bookings",
                       description="Episodes whose booking clashes with someone's busy time / episodes that booked.",
                       value=final_feature("clash"), unit="rate", higher_is_better=False),),
    data_files={"calendar": "calendar_path"},
    subgoals=(Subgoal(name="clarify", text="Ask the user for every detail the request leaves out.",
                      check="subgoal:clarified", when="ambiguous"),
              Subgoal(name="find_slot", text="Check the calendars for a window that fits everyone.",
                      check="tool:check_calendar"),
              Subgoal(name="book", text="Book the meeting the user asked for.", check="success")),
)
