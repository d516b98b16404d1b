"""``polyturn/Negotiation-v0`` with ``opponent="self"``: both sides of the deal are players.

The scenario of the seed (:func:`.game.generate_scenario`; its scripted
strategy is unused): role ``first`` holds ``agent_values``, role ``second``
``opponent_values``; ``first`` opens. Both roles have the single-agent env's
tools with the same argument forms, parsing and errors:

* ``propose``: the counts the proposer gets; it replaces any standing proposal,
  and the turn passes;
* ``accept``: take the other side's standing proposal (a deal: terminated);
* ``reject``: turn it down without a counter-offer; the turn passes, with no
  proposal standing;
* ``walk_away``: end with no deal (terminated).

Like the single-agent env, there is no ``remember`` tool. An invalid action is
answered to its role, counts as its turn, and the same role acts again.
``max_turns`` counts each role's own turns; the game is truncated (no deal)
when the role to act next has none left.

The opening side's experience against a scripted partner is the single-agent
env's, word for word (:mod:`.texts`): its introduction, "They reject your offer
(...). They propose: ..." when the other side counters, "They accept. Deal: ..."
and the turn-limit line; the second role reads the mirror image. Only moves the
scripted opponent never makes have texts of their own (a rejection without a
counter-offer, walking away). A move that passes the turn is answered when the
other side moves, so the mover is told nothing at its own step.

Rewards per role, paid to its last action: ``outcome/utility`` (its worth of the
deal, 0 without one) and ``outcome/fairness`` (``-fairness_weight x |difference
of the two worths|`` at a deal) when the game ends, any weighted terms of
``reward_weights`` for its own actions, and the weighted ``outcome/*`` term of
its ending (success: its worth >= ``success_threshold``; failure; timeout). A
role that has not acted is paid nothing. Features per role are the single-agent
env's (:data:`.env.NEG_FEATURES` after ToolEnv's base features) from its own
side: ``round`` counts the other side's proposals, ``has_offer`` /
``standing_worth`` describe the other side's latest proposal. The last step's
info has ``"deal"`` (:func:`.game.deal_figures`, roles ``first`` / ``second``).
``task_id``: ``neg-self-s<seed>``, level 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from polyturn.envs.actions import ToolCall, format_action
from polyturn.envs.base import BadArgs, ToolResult, dispatch_action
from polyturn.envs.multi_agent import MultiAgentEnv, MultiStep, RoleUpdate
from polyturn.envs.negotiation import texts
from polyturn.envs.negotiation.env import DEFAULT_WEIGHTS, TOOL_HELP, _no_args
from polyturn.envs.negotiation.game import (
    ITEMS,
    TOTAL_VALUE,
    Split,
    deal_figures,
    format_split,
    generate_scenario,
    parse_split,
    rest,
    value_of,
)
from polyturn.envs.rewards import Outcome, RewardWeights, StepEvents, check_terms, reward_terms
from polyturn.envs.spaces import TextSpace

ROLES = ("first", "second")
RESET_OPTIONS = frozenset({"task_id", "max_turns"})
_TASK_ID = re.compile(r"neg-self-s(\d+)")


@dataclass
class _Side:
    """One role's private state and counters."""

    values: Split
    turn: int = 0
    proposals: list[Split] = field(default_factory=list)  # its own proposals (its share)
    received: list[Split] = field(default_factory=list)  # the other side's proposals (its share)
    lead: str | None = None  # how the answer to its last proposal or rejection begins
    seen: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("n_errors", "n_invalid", "n_repeats"), 0))
    tools_used: set[str] = field(default_factory=set)


def _join(text: str | None, line: str) -> str:
    return line if text is None else f"{text}\n{line}"


class NegotiationSelfPlayEnv(MultiAgentEnv):
    """Deal-or-no-deal between two players, ``first`` and ``second`` (see the module docstring).

    Args:
        max_turns: each role's turns before truncation (no deal).
        fairness_weight: weight (>= 0) of the ``outcome/fairness`` term.
        success_threshold: the least worth (0-10) of a deal that counts as a role's success.
        reward_weights: overrides of the weighted terms (all 0 by default).
        render_mode: ``None`` or ``"ansi"``.
        max_chars: longest observation (longer ones are cut) and action.
    """

    roles = ROLES
    value_terms = ("outcome/utility", "outcome/fairness")

    def __init__(
        self,
        *,
        max_turns: int = 10,
        fairness_weight: float = 0.0,
        success_threshold: float = 5.0,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        render_mode: str | None = None,
        max_chars: int = 4000,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"Expected max_turns >= 1, got {max_turns}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"Expected render_mode in {self.metadata['render_modes']} or None, got {render_mode!r}")
        if fairness_weight < 0:
            raise ValueError(f"Expected fairness_weight >= 0, got {fairness_weight}")
        if not 0 <= success_threshold <= TOTAL_VALUE:
            raise ValueError(f"Expected success_threshold in [0, {TOTAL_VALUE}], got {success_threshold}")
        weights = reward_weights if isinstance(reward_weights, RewardWeights) else {
            **DEFAULT_WEIGHTS, **dict(reward_weights or {})}
        self.weights = RewardWeights.model_validate(weights)
        check_terms(self.weights)
        self.default_max_turns = self.max_turns = max_turns
        self.fairness_weight = float(fairness_weight)
        self.success_threshold = float(success_threshold)
        self.render_mode = render_mode
        self.max_chars = max_chars
        self.observation_space = TextSpace(max_chars, min_length=1)
        self.action_space = TextSpace(max_chars)
        self.tools = {"propose": self._propose, "accept": self._accept, "reject": self._reject,
                      "walk_away": self._walk_away}
        self.tool_help = dict(TOOL_HELP)
        self.enabled = tuple(self.tools)
        self.scenario = generate_scenario(0)
        self.task_id = ""
        self._sides = {role: _Side(self.scenario.agent_values) for role in ROLES}
        self._turn = ROLES[0]
        self._standing: tuple[str, Split] | None = None  # (proposer, the proposer's share)
        self._deal: Split | None = None  # first's share in the deal made
        self._done = True
        self._told: str | None = None  # what the current move tells the other side
        self._passes = False  # whether the current move passes the turn
        self._last: dict[str, str | None] = {}

    # ----- the contract -----------------------------------------------------------------------
    @property
    def agent_selection(self) -> str:
        """The role whose turn it is."""
        return self._turn

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
        """A new game; options ``task_id`` (``neg-self-s<seed>``) and ``max_turns``. ``level`` is refused."""
        super().reset(seed=seed)
        options = dict(options or {})
        if "level" in options:
            raise ValueError(f"Expected no level in self-play (levels pick a scripted opponent's strategy), got "
                             f"level={options['level']!r}")
        unknown = set(options) - RESET_OPTIONS
        if unknown:
            raise ValueError(f"Expected reset options among {sorted(RESET_OPTIONS)}, got unknown {sorted(unknown)}")
        max_turns = int(options.get("max_turns", self.default_max_turns))
        if max_turns < 1:
            raise ValueError(f"Expected max_turns >= 1, got {max_turns}")
        task_seed = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
        if options.get("task_id") is not None:
            match = _TASK_ID.fullmatch(str(options["task_id"]))
            if match is None:
                raise ValueError(f"Expected a task_id like 'neg-self-s17', got {options['task_id']!r}")
            task_seed = int(match.group(1))
        # all checks passed: only now does the game in progress end
        s = self.scenario = generate_scenario(task_seed)
        self.task_id = f"neg-self-s{task_seed}"
        self.max_turns = max_turns
        self._sides = {"first": _Side(s.agent_values), "second": _Side(s.opponent_values)}
        self._turn = ROLES[0]
        self._standing = None
        self._deal = None
        self._done = False
        out = {}
        for role in ROLES:
            obs = self._cap(texts.intro(s.counts, self._sides[role].values, max_turns, they_open=role != ROLES[0]))
            out[role] = (obs, {
                "task_id": self.task_id,
                "question": obs,
                "level": 0,
                "ambiguous": False,
                "privileged": self._privileged(role),
                "turn": 0,
                "features": self._features(role),
                "tools": list(self.enabled),
                "key_actions": ["propose", "accept"],
                "role": role,
            })
        self._last = {role: out[role][0] for role in ROLES}
        return out

    def step(self, action: str) -> MultiStep:  # type: ignore[override]
        """The role to act (``agent_selection``) writes ``action``; an update for every role."""
        if self._done:
            raise RuntimeError("Expected reset() before step(), got step() on a finished or unstarted game")
        if not isinstance(action, str):
            raise TypeError(f"Expected the action as str, got {type(action).__name__}")
        actor = self._turn
        other = self._other(actor)
        me = self._sides[actor]
        me.turn += 1
        self._told, self._passes = None, False
        ev = StepEvents()
        obs, error, action_type, result, key = dispatch_action(
            action, ev, tools=self.tools, enabled=self.enabled, repeat_key=self._repeat_key)
        if result is not None:
            me.tools_used.add(action_type)
        ev.repeat = key in me.seen
        me.seen.add(key)
        if ev.repeat:
            error = "repeat"
            me.counts["n_repeats"] += 1
        me.counts["n_errors"] += error is not None
        me.counts["n_invalid"] += action_type == "invalid"
        terminated = result is not None and result.done
        following = other if self._passes else actor
        truncated = not terminated and self._sides[following].turn >= self.max_turns
        self._turn = following
        self._done = terminated or truncated
        said: dict[str, str | None] = {actor: None if self._passes else obs, other: self._told}
        if truncated:
            for role in ROLES:
                line = (f"(Turn limit of {self.max_turns} reached without an answer.)" if role == following
                        else f"(They reached their turn limit of {self.max_turns}: no deal.)")
                said[role] = _join(said[role], line)
        outcomes = self._outcomes(truncated) if self._done else dict.fromkeys(ROLES)
        updates = {}
        for role in ROLES:
            terms = self._terms(role, ev if role == actor else None, outcomes[role])
            info: dict[str, Any] = {"role": role, "turn": self._sides[role].turn,
                                    "privileged": self._privileged(role), "features": self._features(role)}
            if role == actor:
                info |= {"action_valid": action_type != "invalid", "action_type": action_type, "error": error,
                         "wasted": error is None and result is not None and not result.credit}
            if self._done:
                info["success"] = outcomes[role] == "success"
                info["deal"] = deal_figures(self.scenario, self._deal, roles=ROLES)
            text = None if said[role] is None else self._cap(said[role])
            updates[role] = RoleUpdate(text, float(sum(terms.values())), terms, info)
        self._last = {role: updates[role].observation for role in ROLES}
        return MultiStep(updates, terminated, truncated)

    def tool_docs(self, role: str) -> str:
        """The single-agent env's rules and tools (the same for both roles)."""
        self._check_role(role)
        return texts.rules(self.enabled, self.tool_help)

    def sample_valid_action(self, rng: Any) -> str:
        """A random proposal, or a rejection when the other side has a proposal standing."""
        can_reject = self._standing is not None and self._standing[0] != self._turn
        if can_reject and rng.random() < 0.25:
            return format_action("reject", {})
        split = {item: int(rng.integers(c + 1)) for item, c in zip(ITEMS, self.scenario.counts)}
        return format_action("propose", split)

    def role_view(self, role: str) -> Mapping[str, Any]:
        """``role``'s private state: ``counts``, own ``values``, ``standing`` (the other side's standing
        proposal as ``role``'s share, or None), ``round`` (how many proposals ``role`` has made: the
        scripted opponent's round), ``my_proposals`` / ``their_proposals`` (as ``role``'s share, in
        order) and ``turns_left``."""
        self._check_role(role)
        side = self._sides[role]
        standing = None
        if self._standing is not None and self._standing[0] != role:
            standing = rest(self.scenario.counts, self._standing[1])
        return MappingProxyType({
            "counts": self.scenario.counts,
            "values": side.values,
            "standing": standing,
            "round": len(side.proposals),
            "my_proposals": tuple(side.proposals),
            "their_proposals": tuple(side.received),
            "turns_left": self.max_turns - side.turn,
        })

    def render(self) -> str | None:
        """With ``render_mode="ansi"``, what each role was told last."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{role}] {text}" for role, text in self._last.items() if text is not None)

    # ----- state, rewards, features -----------------------------------------------------------
    def _other(self, role: str) -> str:
        return ROLES[1] if role == ROLES[0] else ROLES[0]

    def _check_role(self, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"Expected a role among {ROLES}, got {role!r}")

    def _cap(self, text: str) -> str:
        text = text or "(empty)"
        return text if len(text) <= self.max_chars else text[: self.max_chars - 15] + "\n(output cut)"

    def worth(self, role: str, share: Split | None) -> int:
        """What ``share`` (of the pool) is worth to ``role``."""
        return 0 if share is None else value_of(self._sides[role].values, share)

    def _deal_share(self, role: str) -> Split | None:
        if self._deal is None:
            return None
        return self._deal if role == ROLES[0] else rest(self.scenario.counts, self._deal)

    def _privileged(self, role: str) -> str:
        return f"Opponent values: {format_split(self._sides[self._other(role)].values)}."

    def _outcomes(self, truncated: bool) -> dict[str, Outcome | None]:
        """Each role's ending, once the game is over: success, failure (no deal: a walk-away), or timeout."""
        if self._deal is not None:
            return {r: "success" if self.worth(r, self._deal_share(r)) >= self.success_threshold else "failure"
                    for r in ROLES}
        return dict.fromkeys(ROLES, "timeout" if truncated else "failure")

    def _terms(self, role: str, ev: StepEvents | None, outcome: Outcome | None) -> dict[str, float]:
        """``role``'s reward terms this step: ``ev`` for the actor, the ending's terms for a role that has acted."""
        if ev is None and self._sides[role].turn == 0:  # nothing before its first action
            return dict.fromkeys((*self.weights.terms(), *self.value_terms), 0.0)
        if ev is None:
            terms = {t: (w if outcome is not None and t == f"outcome/{outcome}" else 0.0)
                     for t, w in self.weights.terms().items()}
        else:
            ev.outcome = outcome
            terms = reward_terms(ev, self.weights)
        mine = self.worth(role, self._deal_share(role))
        theirs = self.worth(self._other(role), self._deal_share(self._other(role)))
        dealt = outcome is not None and self._deal is not None
        return terms | {"outcome/utility": float(mine) if dealt else 0.0,
                        "outcome/fairness": -self.fairness_weight * abs(mine - theirs) if dealt else 0.0}

    def _features(self, role: str) -> dict[str, float]:
        side = self._sides[role]
        last = side.proposals[-1] if side.proposals else None
        latest = side.received[-1] if side.received else None
        deal = self._deal_share(role)
        return {
            "turn_frac": side.turn / self.max_turns,
            "turns_left": float(self.max_turns - side.turn),
            **{k: float(v) for k, v in side.counts.items()},
            "tools_used": float(len(side.tools_used)),
            "round": float(len(side.received)),
            "n_proposals": float(len(side.proposals)),
            "has_offer": float(latest is not None),
            "standing_worth": self.worth(role, latest) / TOTAL_VALUE,
            "best_offer_worth": max((self.worth(role, s) for s in side.received), default=0) / TOTAL_VALUE,
            "last_proposal_worth": self.worth(role, last) / TOTAL_VALUE,
            "deal": float(deal is not None),
            "deal_worth": self.worth(role, deal) / TOTAL_VALUE,
        }

    def _repeat_key(self, call: ToolCall) -> str:
        # as the single-agent env: every valid call is new (holding an offer is a tactic)
        key = "call:" + call.tool + json.dumps(call.args, sort_keys=True, ensure_ascii=False)
        return f"turn{self._sides[self._turn].turn}:{key}"

    # ----- tools (the acting role is agent_selection) -----------------------------------------
    def _pass_turn(self, told: str, lead: str) -> ToolResult:
        """The move passes the turn: the other side is told ``told``; its answer will start with ``lead``."""
        actor, other = self._turn, self._other(self._turn)
        self._told, self._passes = told, True
        self._sides[other].lead = None
        self._sides[actor].lead = lead
        return ToolResult("")

    def _standing_from_other(self, tool: str) -> Split:
        if self._standing is None or self._standing[0] == self._turn:
            raise BadArgs(f"Expected a proposal from the other side to {tool}, got none yet: propose first")
        return self._standing[1]

    def _propose(self, args: dict[str, Any]) -> ToolResult:
        message = args.get("message")
        if message is not None and (not isinstance(message, str) or len(message) > 500):
            raise BadArgs(f'Expected "message" as text of at most 500 characters, got {str(message)[:40]!r}...')
        try:
            split = parse_split(args, self.scenario.counts)
        except ValueError as exc:
            raise BadArgs(str(exc)) from exc
        actor, other = self._turn, self._other(self._turn)
        them = self._sides[other]
        theirs = rest(self.scenario.counts, split)
        self._sides[actor].proposals.append(split)
        them.received.append(theirs)
        self._standing = (actor, split)
        told = texts.offer(them.lead, theirs, split, self.worth(other, theirs), self.max_turns - them.turn)
        return self._pass_turn(told, texts.rejected(split))

    def _accept(self, args: dict[str, Any]) -> ToolResult:
        _no_args("accept", args)
        theirs = self._standing_from_other("accept")
        actor, other = self._turn, self._other(self._turn)
        mine = rest(self.scenario.counts, theirs)
        self._deal = mine if actor == ROLES[0] else theirs
        self._told = texts.deal("They accept.", theirs, self.worth(other, theirs))
        worth = self.worth(actor, mine)
        return ToolResult(texts.deal("You accept.", mine, worth), done=True, success=worth >= self.success_threshold)

    def _reject(self, args: dict[str, Any]) -> ToolResult:
        _no_args("reject", args)
        theirs = self._standing_from_other("reject")
        other = self._other(self._turn)
        self._standing = None
        told = texts.rejected_outright(theirs, self.max_turns - self._sides[other].turn)
        return self._pass_turn(told, "You reject their proposal.")

    def _walk_away(self, args: dict[str, Any]) -> ToolResult:
        _no_args("walk_away", args)
        self._told = "They walk away. No deal."
        return ToolResult("You walk away. No deal.", done=True, success=False)
