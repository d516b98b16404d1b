"""``meeting/MeetingBooking-v0``: book a meeting in a shared calendar for a user with a hidden goal.

An example of a polyturn environment that lives outside polyturn: installed
with pip, found through the ``polyturn.envs`` entry-point group
(``pyproject.toml``), described by :data:`meeting_booking.spec.SPEC`.
"""
