"""Scripted negotiators for ``polyturn/Negotiation-v0``: a model-based bargainer, exact or noisy.

The exact expert knows its own values and the documented opponent rules
(:mod:`.game`), never the opponent's values or strategy. It keeps every
hypothesis (opponent value vector x strategy) that reproduces every answer
seen so far (the opponents are deterministic, so a counter-proposal or two
usually pins the opponent down), then:

* plans to hold out to the last turn: for each split it estimates the chance
  that the opponent accepts it by the final round (the share of hypotheses
  that would) and targets the split with the highest expected worth;
* accepts a standing proposal worth at least that expected worth;
* otherwise proposes the target (opponents only concede with time, so
  proposing a split they will accept later loses nothing now).

:class:`NegNoise` sets the probability, per episode, of each mistake: accepting
the first counter-proposal whatever it is worth, ignoring the answers (always
asking for its own best split), an needless concession, walking away midway,
one malformed offer (a count over the pool; fixed next turn) and one malformed
action (rewritten next turn).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from pydantic import Field

from polyturn.envs.actions import format_action
from polyturn.envs.noise import MistakeRates
from polyturn.envs.scripted import ScriptedExpert
from polyturn.envs.negotiation.game import ITEMS, STRATEGIES, Split, all_splits, aspiration, value_vectors


class NegNoise(MistakeRates):
    """Per-episode probabilities of the negotiator's mistakes (all 0: the exact expert)."""

    accept_early: float = Field(0.0, ge=0, le=1, description="Accept the first counter-proposal.")
    stubborn: float = Field(0.0, ge=0, le=1, description="Ignore the answers: always ask for the best split.")
    over_concede: float = Field(0.0, ge=0, le=1, description="Give away one unit of the most valued kind.")
    walk_away: float = Field(0.0, ge=0, le=1, description="Walk away at a random turn before the end.")
    bad_offer: float = Field(0.0, ge=0, le=1, description="One offer with a count over the pool, fixed next.")
    format_error: float = Field(0.0, ge=0, le=1, description="One malformed action, rewritten next turn.")


class NegotiationExpert(ScriptedExpert):
    """Model-based bargainer (a :class:`ScriptedExpert`: ``cls(env, noise=..., seed=...)``).

    It reads the pool, its own values, the turn and the opponent's answers from the env, never the
    opponent's values or strategy. ``noise``: a :class:`NegNoise`, or one probability for every mistake.
    """

    NOISE = NegNoise
    RNG_NAME = "polyturn-neg-expert"
    END_TOOL = "an accepted deal or a walk-away"

    def __init__(self, env: gymnasium.Env, *, noise: float | NegNoise = 0.0, seed: int = 0) -> None:
        super().__init__(env, noise=noise, seed=seed)
        self._mistakes: dict[str, Any] = {}
        self._pending: tuple[Split | None, int] | None = None
        self.history: list[tuple[Split | None, int, Split]] = []

    def _plan(self, obs: str, info: Mapping[str, Any]) -> None:
        """Every hypothesis about the opponent is open; draw the mistakes in :class:`NegNoise`'s order."""
        self._pending = None
        self.history = []
        counts = self.env.scenario.counts
        mine = self.env.scenario.agent_values
        self.counts, self.values = counts, np.array(mine)
        self.splits = np.array(all_splits(counts))  # [S, 3]
        vectors = np.array([v for v in value_vectors(counts) if all(x + y > 0 for x, y in zip(v, mine))
                            and any(x > 0 and y > 0 for x, y in zip(v, mine))])  # [V, 3]: the documented draw
        self.opp_worth = vectors @ (np.array(counts) - self.splits).T  # [V, S]: what each split leaves them
        self.my_worth = self.splits @ self.values  # [S]
        # hypotheses: (vector index, strategy) pairs, all open
        self.alive = np.ones((len(vectors), len(STRATEGIES)), dtype=bool)
        turns = self.env.max_turns
        self._mistakes = {
            "accept_early": self._chance("accept_early"),
            "stubborn": self._chance("stubborn"),
            "over_concede": self._chance("over_concede"),
            "walk_away": 1 + self.rng.randrange(max(1, turns - 2)) if self._chance("walk_away") else -1,
            "bad_offer": self.rng.randrange(3) if self._chance("bad_offer") else -1,
            "format_error": self.rng.randrange(4) if self._chance("format_error") else -1,
        }
        self._broken_step = self._mistakes["format_error"]

    def _next(self, obs: str, info: Mapping[str, Any]) -> str:
        self._read()
        return self._decide()

    def _flaw(self, action: str) -> str | None:
        """A count over the pool at the ``bad_offer`` step (if it proposes), else the base's format error."""
        if self._step == self._mistakes["bad_offer"] and "propose" in action:
            bad = {item: n for item, n in zip(ITEMS, self.counts)} | {ITEMS[0]: self.counts[0] + 1}
            return format_action("propose", bad, "Ask for more books.")
        return super()._flaw(action)

    # ----- the opponent model -----------------------------------------------------------------
    def _read(self) -> None:
        """Record the answer to the previous proposal or rejection and drop the hypotheses it refutes."""
        if self._pending is None or self.env.standing is None:
            return
        split, round_ = self._pending
        if self.env.round <= round_:
            return  # no answer yet (a malformed action went first); keep waiting for it
        self._pending = None
        self.history.append((split, round_, self.env.standing))
        counter_index = all_splits(self.counts).index(self.env.standing)
        for k, strategy in enumerate(STRATEGIES):
            target = aspiration(strategy, round_)
            meets = self.opp_worth >= target  # [V, S]
            # the counter each hypothesis makes: most items for the agent, then least surplus, then order
            rank = np.where(meets, -self.splits.sum(1)[None, :] * 1000 + self.opp_worth, 10**9)
            keep = rank.argmin(1) == counter_index
            if split is not None:
                s = all_splits(self.counts).index(split)
                keep &= ~meets[:, s]  # it refused the proposal
            self.alive[:, k] &= keep
        if not self.alive.any():  # cannot happen with the documented opponents; stay useful anyway
            self.alive[:] = True

    def _accept_chance(self, round_: int) -> np.ndarray:
        """Per split, the share of live hypotheses that accept it at ``round_``."""
        hits = np.zeros(len(self.splits))
        for k, strategy in enumerate(STRATEGIES):
            live = self.alive[:, k]
            if live.any():
                hits += (self.opp_worth[live] >= aspiration(strategy, round_)).sum(0)
        return hits / self.alive.sum()

    # ----- decisions --------------------------------------------------------------------------
    def _decide(self) -> str:
        env = self.env
        turns_left = env.max_turns - env.turn
        standing = env.standing
        worth_standing = -1 if standing is None else int(np.dot(standing, self.values))
        if standing is not None and self._mistakes["accept_early"]:
            return format_action("accept", {}, "That offer is good enough.")
        if self._step == self._mistakes["walk_away"]:
            return format_action("walk_away", {}, "This is going nowhere.")
        if self._mistakes["stubborn"]:
            best = self.splits[int(np.argmax(self.my_worth))]
            if turns_left == 1 and worth_standing > 0:
                return format_action("accept", {}, "Last turn: take what is offered.")
            return self._propose(best, "Ask for everything I value.")
        final_round = env.round + turns_left - 1
        expected = self._accept_chance(final_round) * self.my_worth
        order = np.lexsort((-self.my_worth, -expected))  # best expected worth, then own worth
        target = self.splits[int(order[0])]
        plan = float(expected[order[0]])
        if standing is not None and worth_standing >= plan:
            return format_action("accept", {}, f"Their offer is worth {worth_standing}; take it.")
        if self._mistakes["over_concede"] and self.history:
            self._mistakes["over_concede"] = False
            target = target.copy()
            ranked = [i for i in np.argsort(-self.values) if target[i] > 0]
            if ranked:
                target[ranked[0]] -= 1
        return self._propose(target, f"Aim for a split they should accept by the end (about {plan:.1f}).")

    def _propose(self, split: np.ndarray, thought: str) -> str:
        share = tuple(int(n) for n in split)
        self._pending = (share, self.env.round)
        return format_action("propose", dict(zip(ITEMS, share)), thought)
