"""Typed records of what a rollout produced.

An :class:`Episode` keeps the text (for logs, the critic and reports) and the
token-level :class:`Segment` s the actor is trained on. Token-in / token-out:
``Segment.ids`` holds the very ids that were sampled, never a re-tokenization.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Turn info kept in every episode record (demonstrations, rollouts, served sessions); evaluation records, actor
# rollouts and served sessions also keep whether the env marked the turn pointless, and its success flag and number.
TURN_INFO_KEYS = ("action_type", "action_valid", "error", "features", "privileged")
#: An evaluated or served turn's info keys; ``subgoal_index``: on a hierarchical worker's turn, which of the game's
#: subgoals (0, 1, ... in the order the manager set them) the turn served.
EVAL_TURN_INFO_KEYS = (*TURN_INFO_KEYS, "wasted", "success", "turn", "subgoal_index")


def cost_field(info: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{"cost_terms": ...}`` for a turn record when the step reported cost terms (``info["cost_terms"]``), else
    ``{}``: records of an env without costs (and records written before costs existed) keep their form."""
    costs = info.get("cost_terms")
    return {"cost_terms": {k: float(v) for k, v in costs.items()}} if costs else {}


def info_valid(info: dict[str, Any]) -> bool:
    """The env accepted the action: ``info["action_valid"]``, else whether ``info["action_type"]`` is not
    ``invalid``; true when the env says neither. Rollout turns and saved records both read validity here."""
    return bool(info.get("action_valid", info.get("action_type") != "invalid"))


@dataclass
class Segment:
    """One token sequence the actor saw, with the sampled tokens marked.

    ``action_mask[i]`` is 1 only on tokens the actor sampled (or that epsilon
    exploration forced in its place); ``turn_index[i]`` is the turn such a
    token belongs to (-1 elsewhere); ``logprobs[i]`` is its behaviour
    log-prob (0 elsewhere). ``ids[i]`` is predicted from ``ids[:i]``.
    """

    ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add_context(self, ids: list[int]) -> None:
        """Forced tokens: prompt, observations, end-of-message text."""
        self.ids.extend(ids)
        self.action_mask.extend([0] * len(ids))
        self.turn_index.extend([-1] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_action(self, ids: list[int], logprobs: list[float], turn: int) -> None:
        """Tokens the actor produced for ``turn``."""
        self.ids.extend(ids)
        self.action_mask.extend([1] * len(ids))
        self.turn_index.extend([turn] * len(ids))
        self.logprobs.extend(logprobs)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Turn:
    """One agent turn: the state it saw, the action it wrote, what the environment returned."""

    observation: str
    action: str
    action_ids: list[int]
    logprobs: list[float]
    reward: float
    reward_terms: dict[str, float]
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    privileged: str
    features: dict[str, float]
    forced: bool = False
    hit_cap: bool = False
    latency_s: float = 0.0
    #: This turn's share of its batched decode step: the step's seconds times this row's
    #: fraction of the step's generated tokens (so shares over a step sum to its time).
    gen_s: float | None = None
    #: The policy version (learner updates so far) whose weights sampled this turn; rollout workers set it, and
    #: an asynchronous run bounds how far it may lag the learner (``rollout.max_staleness``).
    version: int = 0
    #: The step's cost terms (``info["cost_terms"]``: constraint signals kept apart from the reward), empty for
    #: an env that reports none.
    cost_terms: dict[str, float] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        """The environment accepted the action (:func:`info_valid`)."""
        return info_valid(self.info)


@dataclass
class Episode:
    """A whole conversation: its task, turns, token segments and end state."""

    env_id: str
    seed: int | None
    task_id: str
    question: str
    level: int
    ambiguous: bool
    key_actions: list[str]
    turns: list[Turn] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    final_observation: str = ""
    final_features: dict[str, float] = field(default_factory=dict)
    final_privileged: str = ""
    temperature: float = 1.0
    policy: str = "actor"
    #: In a multi-role game: the role this episode is the view of, and who filled the other seats (a policy's name
    #: or a scripted player's); empty for a single-agent environment.
    role: str = ""
    partner: str = ""

    @property
    def success(self) -> bool:
        return bool(self.turns) and bool(self.turns[-1].info.get("success", False))

    @property
    def episode_return(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def costs(self) -> dict[str, float]:
        """Each cost term summed over the turns (empty for an env that reports none)."""
        out: dict[str, float] = {}
        for t in self.turns:
            for k, v in t.cost_terms.items():
                out[k] = out.get(k, 0.0) + v
        return out

    @property
    def terminated(self) -> bool:
        return bool(self.turns) and self.turns[-1].terminated

    @property
    def truncated(self) -> bool:
        return bool(self.turns) and self.turns[-1].truncated and not self.turns[-1].terminated

    def history(self, t: int) -> list[tuple[str, str]]:
        """(action, following observation) pairs of the turns before turn ``t``."""
        out = []
        for i in range(min(t, len(self.turns))):
            nxt = self.turns[i + 1].observation if i + 1 < len(self.turns) else self.final_observation
            out.append((self.turns[i].action, nxt))
        return out

    def to_record(self) -> dict[str, Any]:
        """The JSON episode record shared with demonstrations (docs/ARCHITECTURE.md)."""
        return {
            "env_id": self.env_id,
            "seed": self.seed,
            "task_id": self.task_id,
            "policy": self.policy,
            "success": self.success,
            "return": self.episode_return,
            "level": self.level,
            "ambiguous": self.ambiguous,
            "question": self.question,
            "privileged": self.turns[0].privileged if self.turns else self.final_privileged,
            "key_actions": list(self.key_actions),
            "turns": [
                {
                    "observation": t.observation,
                    "action": t.action,
                    "reward": t.reward,
                    "reward_terms": dict(t.reward_terms),
                    **({"cost_terms": dict(t.cost_terms)} if t.cost_terms else {}),
                    "terminated": t.terminated,
                    "truncated": t.truncated,
                    "latency_s": t.latency_s,
                    "n_tokens": len(t.action_ids),
                    "gen_s": t.gen_s,
                    "forced": t.forced,
                    "info": {k: v for k, v in t.info.items() if k in EVAL_TURN_INFO_KEYS},
                }
                for t in self.turns
            ],
            "final_observation": self.final_observation,
            **({"role": self.role, "partner": self.partner} if self.role else {}),
        }
