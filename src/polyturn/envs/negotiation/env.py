"""``polyturn/Negotiation-v0``: split a pool of items with a scripted opponent (deal or no deal).

The agent and the opponent each value three item kinds (book, hat, ball) in
private (:mod:`.game`); the agent makes the first offer. Tools:

* ``propose[{"book": 1, "hat": 2, "ball": 0}]`` or, in text form,
  ``propose[{"offer": "book=1 hat=2 ball=0"}]``: the counts **you** get (the
  other side gets the rest); all three kinds are required. An optional
  ``"message"`` (text to the other side) may come along; the opponent answers
  by its own values only, so words change nothing. The opponent accepts (the
  deal is made: terminated) or counter-proposes.
* ``accept[{}]``: take the opponent's standing proposal (deal: terminated).
* ``reject[{}]``: turn down the standing proposal without a counter-offer; the
  opponent proposes again (its aspiration falls with each answer).
* ``walk_away[{}]``: end without a deal (terminated, no success).

Reaching ``max_turns`` without a deal is truncation, with no deal. ``success``
is a deal worth at least ``success_threshold`` to the agent (5: half the pool's
worth), since nearly any offer, even a random one, finds some deal; the
features ``deal`` and ``deal_worth`` give the deal rate and worth.

Reward: ``outcome/utility``, what the agent's share of the deal is worth to it
(0-10; 0 without a deal), plus ``outcome/fairness``: ``-fairness_weight x
|agent's worth - opponent's worth|`` on a deal (``fairness_weight`` is 0 by
default). Every weighted term of :class:`RewardWeights` is 0 unless
``reward_weights`` sets it. Levels: 1 conceding, 2 fair, 3 tough opponent.
``task_id``: ``neg-L<level>-s<seed>``. Privileged text: the opponent's values
and strategy. Repeated offers are not flagged as repeats: holding an offer while
the opponent concedes is a legitimate tactic. The last step's info also has
``"deal"``, the deal's figures for evaluation (:func:`.game.deal_figures`, roles
``agent`` and ``opponent``); nothing else about the episode depends on it.
``opponent="self"`` in ``make_env`` gives the two-role self-play game instead
(:mod:`.selfplay`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from polyturn.envs.actions import ToolCall, format_action
from polyturn.envs.base import BadArgs, EpisodeStart, ToolEnv, ToolResult, check_levels
from polyturn.envs.negotiation import texts
from polyturn.envs.negotiation.game import (
    ITEMS,
    STRATEGIES,
    TOTAL_VALUE,
    Split,
    deal_figures,
    format_split,
    generate_scenario,
    parse_split,
    rest,
    value_of,
)
from polyturn.envs.rewards import RewardWeights

LEVELS = (1, 2, 3)
DEFAULT_WEIGHTS: dict[str, float] = dict.fromkeys(RewardWeights().terms(), 0.0)
TOOL_HELP = {
    "propose": 'propose[{"book": 1, "hat": 2, "ball": 0}]: the counts you get (the other side gets the rest); '
    'the text form {"offer": "book=1 hat=2 ball=0"} works too.',
    "accept": "accept[{}]: accept the other side's standing proposal. Ends the negotiation with a deal.",
    "reject": "reject[{}]: turn down their proposal without a counter-offer; they propose again.",
    "walk_away": "walk_away[{}]: end the negotiation with no deal (worth 0 to you).",
}
NEG_FEATURES = ("round", "n_proposals", "has_offer", "standing_worth", "best_offer_worth", "last_proposal_worth",
                "deal", "deal_worth")
_TASK_ID = re.compile(r"neg-L([1-3])-s(\d+)")


def _no_args(tool: str, args: Mapping[str, Any]) -> None:
    if set(args) - {"message"}:
        raise BadArgs(f"Expected {tool}[{{}}] with no args, got keys {sorted(str(k)[:20] for k in args)}")


class NegotiationEnv(ToolEnv):
    """Deal-or-no-deal negotiation against a scripted opponent (see the module docstring).

    Args:
        level: default level(s), i.e. opponent strategies (1 conceding, 2 fair, 3 tough); by
            default the strategy is drawn from the seed.
        max_turns: turns before truncation (no deal).
        fairness_weight: weight (>= 0) of the ``outcome/fairness`` term.
        success_threshold: the least worth (0-10) of a deal that counts as a success.
        reward_weights: overrides of the weighted terms (all 0 by default).
        render_mode: ``None`` or ``"ansi"``.
    """

    value_terms = ("outcome/utility", "outcome/fairness")

    def __init__(
        self,
        *,
        level: int | list[int] | tuple[int, ...] | None = None,
        max_turns: int = 10,
        fairness_weight: float = 0.0,
        success_threshold: float = 5.0,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if fairness_weight < 0:
            raise ValueError(f"Expected fairness_weight >= 0, got {fairness_weight}")
        weights = reward_weights if isinstance(reward_weights, RewardWeights) else {
            **DEFAULT_WEIGHTS, **dict(reward_weights or {})}
        super().__init__(max_turns=max_turns, reward_weights=weights, render_mode=render_mode)
        self.levels = check_levels(level, LEVELS) if level is not None else None
        self.fairness_weight = float(fairness_weight)
        if not 0 <= success_threshold <= TOTAL_VALUE:
            raise ValueError(f"Expected success_threshold in [0, {TOTAL_VALUE}], got {success_threshold}")
        self.success_threshold = float(success_threshold)
        self.tools = {"propose": self._propose, "accept": self._accept, "reject": self._reject,
                      "walk_away": self._walk_away}
        self.tool_help |= TOOL_HELP
        self.scenario = generate_scenario(0)
        self.round = 0
        self.standing: Split | None = None  # the opponent's current proposal (the agent's share)
        self.proposals: list[Split] = []  # the agent's proposals, in order
        self.counters: list[Split | None] = []  # the opponent's answer to each of them (None: accepted)
        self._best_offer = 0
        self._deal_worth: int | None = None  # the agent's worth of the deal made, if any
        self._deal_split: Split | None = None  # the agent's share in the deal made, if any

    # ----- episode ----------------------------------------------------------------------------
    def _new_task(self, seed: int, options: Mapping[str, Any]) -> EpisodeStart:
        task_id = options.get("task_id")
        levels = self.levels if options.get("level") is None else check_levels(options["level"], LEVELS)
        level = None if levels is None else levels[random.Random(f"polyturn-neg-level-{seed}").randrange(len(levels))]
        if task_id is not None:
            match = _TASK_ID.fullmatch(str(task_id))
            if match is None:
                raise ValueError(f"Expected a task_id like 'neg-L2-s17', got {task_id!r}")
            level, seed = int(match.group(1)), int(match.group(2))
        self.scenario = generate_scenario(seed, strategy=None if level is None else STRATEGIES[level - 1])
        self.round = 0
        self.standing = None
        self.proposals = []
        self.counters = []
        self._best_offer = 0
        self._deal_worth: int | None = None
        self._deal_split: Split | None = None
        s = self.scenario
        return EpisodeStart(
            task_id=f"neg-L{s.level}-s{seed}",
            question=texts.intro(s.counts, s.agent_values, self.max_turns),
            level=s.level,
            ambiguous=False,
            privileged=f"Opponent strategy: {s.strategy}. Opponent values: {format_split(s.opponent_values)}.",
            key_actions=("propose", "accept"),
        )

    def _task_features(self) -> dict[str, float]:
        last = self.proposals[-1] if self.proposals else None
        return {
            "round": float(self.round),
            "n_proposals": float(len(self.proposals)),
            "has_offer": float(self.standing is not None),
            "standing_worth": self.worth(self.standing) / TOTAL_VALUE if self.standing else 0.0,
            "best_offer_worth": self._best_offer / TOTAL_VALUE,
            "last_proposal_worth": self.worth(last) / TOTAL_VALUE if last else 0.0,
            "deal": float(self._deal_worth is not None),
            "deal_worth": (self._deal_worth or 0) / TOTAL_VALUE,
        }

    def worth(self, split: Split | None) -> int:
        """What ``split`` (the agent's share) is worth to the agent."""
        return 0 if split is None else value_of(self.scenario.agent_values, split)

    def tool_docs(self) -> str:
        """The rules, the action format and the tools."""
        return texts.rules(self.enabled or tuple(self.tools), self.tool_help)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`ToolEnv.step`; the last step's info also has ``"deal"`` (:func:`.game.deal_figures`)."""
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated or truncated:
            info["deal"] = deal_figures(self.scenario, self._deal_split, roles=("agent", "opponent"))
        return obs, reward, terminated, truncated, info

    # ----- tools ------------------------------------------------------------------------------
    def _deal(self, split: Split, lead: str) -> ToolResult:
        mine = self.worth(split)
        theirs = value_of(self.scenario.opponent_values, rest(self.scenario.counts, split))
        fairness = -self.fairness_weight * abs(mine - theirs)
        self._deal_worth = mine
        self._deal_split = split
        return ToolResult(texts.deal(lead, split, mine), done=True, success=mine >= self.success_threshold,
                          terms={"outcome/utility": float(mine), "outcome/fairness": fairness})

    def _counter(self, lead: str) -> ToolResult:
        """The opponent proposes at the current round; the round advances."""
        self.standing = self.scenario.opponent.counter(self.round)
        self.round += 1
        self._best_offer = max(self._best_offer, self.worth(self.standing))
        they_get = rest(self.scenario.counts, self.standing)
        return ToolResult(texts.offer(lead, self.standing, they_get, self.worth(self.standing),
                                      self.max_turns - self.turn))

    def _propose(self, args: dict[str, Any]) -> ToolResult:
        message = args.get("message")
        if message is not None and (not isinstance(message, str) or len(message) > 500):
            raise BadArgs(f'Expected "message" as text of at most 500 characters, got {str(message)[:40]!r}...')
        try:
            split = parse_split(args, self.scenario.counts)
        except ValueError as exc:
            raise BadArgs(str(exc)) from exc
        self.proposals.append(split)
        if self.scenario.opponent.accepts(split, self.round):
            self.counters.append(None)
            return self._deal(split, "They accept.")
        result = self._counter(texts.rejected(split))
        self.counters.append(self.standing)
        return result

    def _accept(self, args: dict[str, Any]) -> ToolResult:
        _no_args("accept", args)
        if self.standing is None:
            raise BadArgs("Expected a proposal from the other side to accept, got none yet: propose first")
        return self._deal(self.standing, "You accept.")

    def _reject(self, args: dict[str, Any]) -> ToolResult:
        _no_args("reject", args)
        if self.standing is None:
            raise BadArgs("Expected a proposal from the other side to reject, got none yet: propose first")
        return self._counter("You reject their proposal.")

    def _walk_away(self, args: dict[str, Any]) -> ToolResult:
        _no_args("walk_away", args)
        return ToolResult("You walk away. No deal.", done=True, success=False)

    def _repeat_key(self, call: ToolCall) -> str:
        # Holding an offer (or rejecting again) while the opponent concedes is a tactic, not a
        # pointless repeat, so every valid call is new; malformed text still counts as a repeat.
        return f"turn{self.turn}:" + super()._repeat_key(call)

    def example_args(self, tool: str, rng: Any) -> dict[str, Any]:
        """A random valid split for ``propose``."""
        if tool == "propose":
            return {item: int(rng.integers(c + 1)) for item, c in zip(ITEMS, self.scenario.counts)}
        return {}

    def sample_valid_action(self, rng: Any) -> str:
        """A random proposal, or a rejection when the other side has a proposal standing."""
        names = self.enabled or tuple(self.tools)
        can_reject = self.standing is not None and "reject" in names
        tool = "reject" if can_reject and (rng.random() < 0.25 or "propose" not in names) else "propose"
        return format_action(tool, self.example_args(tool, rng))
