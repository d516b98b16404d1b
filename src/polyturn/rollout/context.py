"""One conversation's token context and the **context policy**, shared by rollout and BC.

Contexts are append-only. When the next action could push a context past
``context_budget`` tokens, the context is rebuilt:

    the task (with the agent's ``remember`` notes appended to it), then the
    most recent turns that fit, at most ``keep_last_turns``; older turns drop.

A rebuilt context starts a new :class:`Segment`. Training reads the stored
segments, so it sees exactly the context each action was sampled from; BC
builds its segments from demonstrations with this same class.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyturn.envs.actions import ToolCall, parse_action
from polyturn.models.actor import Actor
from polyturn.rollout.types import Segment


@dataclass(frozen=True)
class RolloutSettings:
    """How actions are sampled and contexts kept (config section ``rollout``)."""

    max_action_tokens: int = 96
    context_budget: int = 1024
    keep_last_turns: int = 4
    system_prompt: bool = False
    top_p: float = 1.0


class Conversation:
    """The growing token context of one episode, split into segments by the context policy."""

    def __init__(self, actor: Actor, settings: RolloutSettings, *, task: str, system: str | None) -> None:
        self.actor = actor
        self.settings = settings
        self.task = task
        self.system = system
        self.notes: list[str] = []
        self.pieces: list[tuple[list[int], list[int]]] = []  # (action ids, forced ids after it) per turn
        self.segments: list[Segment] = []
        self._pending_action: list[int] | None = None
        self._new_segment(self._prefix_ids())

    @property
    def seg(self) -> Segment:
        """The segment being extended (the current context)."""
        return self.segments[-1]

    def _prefix_ids(self) -> list[int]:
        task = self.task
        if self.notes:
            task = task + "\n\nNotes from earlier turns:\n" + "\n".join(f"- {n}" for n in self.notes)
        return self.actor.encode(self.actor.chat.render_prefix(task, self.system))

    def _new_segment(self, ids: list[int]) -> None:
        seg = Segment()
        seg.add_context(ids)
        self.segments.append(seg)

    def needs_rebuild(self) -> bool:
        """Would the next action (at its token cap) overflow the budget?"""
        return len(self.seg) + self.settings.max_action_tokens > self.settings.context_budget

    def rebuild(self) -> None:
        """Apply the context policy and start a new segment."""
        prefix = self._prefix_ids()
        room = self.settings.context_budget - self.settings.max_action_tokens - len(prefix)
        if room < 0:
            raise ValueError(
                f"Expected rollout.context_budget ({self.settings.context_budget}) to hold the task "
                f"({len(prefix)} tokens) plus rollout.max_action_tokens ({self.settings.max_action_tokens}); "
                "raise rollout.context_budget."
            )
        kept: list[int] = []
        for action_ids, after_ids in reversed(self.pieces[-self.settings.keep_last_turns:]):
            piece = action_ids + after_ids
            if len(piece) + len(kept) > room:
                break
            kept = piece + kept
        self._new_segment(prefix + kept)

    def add_action(self, ids: list[int], logprobs: list[float], *, turn: int, text: str) -> None:
        """Record the actor's action tokens for ``turn`` (notes of a ``remember`` action are kept)."""
        self.seg.add_action(ids, logprobs, turn)
        self._pending_action = list(ids)
        parsed = parse_action(text)
        if isinstance(parsed, ToolCall) and parsed.tool == "remember":
            note = str(parsed.args.get("note", "")).strip()
            if note:
                self.notes.append(note)

    def add_observation(self, observation: str, *, close_action: bool) -> list[int]:
        """Append the forced tokens after an action; returns them (for the decoder's cache).

        ``close_action`` adds the stop token first, for an action cut at its token cap.
        """
        after = ([self.actor.stop_id] if close_action else []) + self.actor.encode(
            self.actor.chat.render_observation(observation)
        )
        self.seg.add_context(after)
        self.pieces.append((self._pending_action or [], after))
        self._pending_action = None
        return after


@dataclass
class DemoTokens:
    """A demonstration as BC reads it: its token segments, and how many of its actions were cut at the cap."""

    segments: list[Segment]
    n_actions: int
    n_cut: int
    longest_action: int  # tokens of the longest action before cutting (its stop token included)


def tokenize_demo(actor: Actor, settings: RolloutSettings, record: dict, *, system: str | None = None) -> DemoTokens:
    """Token segments of a demonstration record for BC, built with the rollout's context policy.

    Demonstrations are text, so their actions are tokenized here (and, the same way,
    :func:`written_action_ids` tokenizes other written actions); the stop token closes each action. An action
    longer than ``max_action_tokens`` (stop token included) is cut to the cap, as
    a sampled one would be, and counted in ``n_cut``: BC on it teaches the actor
    to stop early, so the trainer reports the count and refuses too many.
    ``system`` must be the system prompt the rollouts use (None without one).
    """
    turns = record["turns"]
    conv = Conversation(actor, settings, task=turns[0]["observation"] if turns else record["question"], system=system)
    n_cut = longest = 0
    for t, turn in enumerate(turns):
        if conv.needs_rebuild():
            conv.rebuild()
        enc = actor.encode(turn["action"])
        longest = max(longest, len(enc) + 1)
        n_cut += len(enc) + 1 > settings.max_action_tokens
        ids = closed_action(actor, enc, settings)
        conv.add_action(ids, [0.0] * len(ids), turn=t, text=turn["action"])
        if t + 1 < len(turns):
            conv.add_observation(turns[t + 1]["observation"], close_action=False)
    return DemoTokens(segments=conv.segments, n_actions=len(turns), n_cut=n_cut, longest_action=longest)


def closed_action(actor: Actor, ids: list[int], settings: RolloutSettings) -> list[int]:
    """A written action's ids as BC reads them: cut to ``max_action_tokens`` with the stop token closing them."""
    return ids[: settings.max_action_tokens - 1] + [actor.stop_id]


def written_action_ids(actor: Actor, settings: RolloutSettings, text: str) -> list[int]:
    """The ids of an action written as text (a demonstration's, an expert's refusal), tokenized as
    :func:`tokenize_demo` tokenizes a demonstration's actions."""
    return closed_action(actor, actor.encode(text), settings)


def demo_segments(actor: Actor, settings: RolloutSettings, record: dict, *, system: str | None = None) -> list[Segment]:
    """The token segments of :func:`tokenize_demo` alone."""
    return tokenize_demo(actor, settings, record, system=system).segments
