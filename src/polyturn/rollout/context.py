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


def demo_segments(actor: Actor, settings: RolloutSettings, record: dict, *, system: str | None = None) -> list[Segment]:
    """Token segments of a demonstration record for BC, built with the rollout's context policy.

    Demonstrations are text, so their actions are tokenized here (the only place
    polyturn tokenizes an action); the stop token closes each action.
    """
    turns = record["turns"]
    conv = Conversation(actor, settings, task=turns[0]["observation"] if turns else record["question"], system=system)
    for t, turn in enumerate(turns):
        if conv.needs_rebuild():
            conv.rebuild()
        ids = actor.encode(turn["action"])[: settings.max_action_tokens - 1] + [actor.stop_id]
        conv.add_action(ids, [0.0] * len(ids), turn=t, text=turn["action"])
        if t + 1 < len(turns):
            conv.add_observation(turns[t + 1]["observation"], close_action=False)
    return conv.segments
