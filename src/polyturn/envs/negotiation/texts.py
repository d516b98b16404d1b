"""What a side of a negotiation reads: its introduction, the other side's moves, the rules.

Both :class:`~polyturn.envs.negotiation.env.NegotiationEnv` (against a scripted
opponent) and :class:`~polyturn.envs.negotiation.selfplay.NegotiationSelfPlayEnv`
write through these functions, so the opening side of a self-play game reads,
word for word, what the agent reads against a scripted opponent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polyturn.envs.actions import format_action
from polyturn.envs.negotiation.game import ITEMS, TOTAL_VALUE, Split, format_split


def intro(counts: Split, values: Split, max_turns: int, *, they_open: bool = False) -> str:
    """The task introduction of a side with private ``values``; ``they_open``: the other side offers first."""
    pool = ", ".join(f"{n} {item}{'s' if n > 1 else ''}" for item, n in zip(ITEMS, counts))
    opening = "They make the first offer. " if they_open else ""
    return (
        f"Negotiate how to split {pool} with the other side. Your values: {format_split(values)} "
        f"(the whole pool is worth {TOTAL_VALUE} to you). They value the items their own way. {opening}"
        f"Propose what you get; they get the rest. No deal is worth 0. You have {max_turns} turns."
    )


def turns_left(left: int) -> str:
    """``3 turns left.`` / ``1 turn left.``"""
    return f"{left} turn{'s' if left != 1 else ''} left."


def offer(lead: str | None, you_get: Split, they_get: Split, worth: int, left: int) -> str:
    """The other side proposes ``you_get`` (worth ``worth`` to the reader), after ``lead`` if any."""
    text = (f"They propose: you get {format_split(you_get)}, they get {format_split(they_get)} "
            f"(worth {worth} to you). {turns_left(left)}")
    return f"{lead} {text}" if lead else text


def deal(lead: str, share: Split, worth: int) -> str:
    """A deal is made: the reader gets ``share``, worth ``worth`` to it."""
    return f"{lead} Deal: you get {format_split(share)} (worth {worth} to you)."


def rejected(share: Split) -> str:
    """The lead for an answer to the reader's proposal of ``share`` that turns it down."""
    return f"They reject your offer ({format_split(share)} for you)."


def rejected_outright(share: Split, left: int) -> str:
    """The other side turned down the reader's proposal of ``share`` and made none of its own (self-play only)."""
    return f"They reject your offer ({format_split(share)} for you) without a counter-offer. {turns_left(left)}"


def rules(names: Sequence[str], tool_help: Mapping[str, str]) -> str:
    """The rules, the action format and the tools ``names``, for a system prompt."""
    return "\n".join([
        "Negotiation: split a pool of books, hats and balls with the other side. Each side values the items "
        "privately; your reward is what your share is worth to you (0 without a deal).",
        "Reply with an optional line `Thought: <short reasoning>` and then exactly one line",
        "`Action: tool_name[{json args}]`. Tools:",
        *[f"- {tool_help[n]}" for n in names],
        "Example reply:",
        format_action("propose", {"book": 1, "hat": 0, "ball": 2}, "Keep what I value most."),
        "Write one action per reply, in exactly that form, and nothing after it.",
    ])
