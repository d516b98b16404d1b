"""Deal-or-no-deal game logic: scenarios, offers, and the scripted opponents.

A :class:`Scenario` is a pool of three item kinds (``book``, ``hat``, ``ball``;
1-5 of each), the agent's private values and the opponent's (non-negative
integers; the whole pool is worth exactly 10 to each side, every item kind is
worth something to at least one side, and at least one kind is worth something
to both, so both sides cannot get everything they want, as in Lewis et al.
2017), and
the opponent's strategy. An offer (a *split*) is the count of each kind the
**agent** gets; the opponent gets the rest.

Opponents answer by their own values only (:class:`Opponent`): each has an
aspiration, the least it accepts, that falls with the round (the number of
times it has answered):

=============  ===============================  ==========================
strategy       aspiration at round r (0, 1, ..)  level (difficulty)
=============  ===============================  ==========================
``conceding``  max(3, 8 - 2r)                   1
``fair``       5 (half the pool's worth to it)   2
``tough``      max(6, 10 - r)                   3
=============  ===============================  ==========================

It accepts an offer that leaves it at least its aspiration; otherwise it
counter-proposes the split that meets its aspiration and leaves the agent the
most items (it does not know the agent's values), the least surplus for
itself breaking ties, then the first in a fixed order.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

ITEMS = ("book", "hat", "ball")
TOTAL_VALUE = 10
Strategy = Literal["conceding", "fair", "tough"]
STRATEGIES: tuple[Strategy, ...] = ("conceding", "fair", "tough")
Split = tuple[int, int, int]
_PAIR = re.compile(r"([A-Za-z]+)=([0-9]{1,3})")


def aspiration(strategy: Strategy, round_: int) -> int:
    """The least the opponent accepts at ``round_`` (see the module table)."""
    if strategy == "conceding":
        return max(3, 8 - 2 * round_)
    if strategy == "fair":
        return TOTAL_VALUE // 2
    if strategy == "tough":
        return max(6, 10 - round_)
    raise ValueError(f"Expected a strategy among {STRATEGIES}, got {strategy!r}")


def value_of(values: Sequence[int], share: Sequence[int]) -> int:
    """What ``share`` (counts per kind) is worth under ``values``."""
    return sum(v * n for v, n in zip(values, share))


def rest(counts: Sequence[int], split: Sequence[int]) -> Split:
    """The opponent's share when the agent gets ``split``."""
    return tuple(c - s for c, s in zip(counts, split))  # type: ignore[return-value]


@cache
def all_splits(counts: Split) -> tuple[Split, ...]:
    """Every split of the pool, in a fixed order."""
    return tuple(itertools.product(*(range(c + 1) for c in counts)))  # type: ignore[arg-type]


@cache
def value_vectors(counts: Split) -> tuple[Split, ...]:
    """Every non-negative integer value vector under which the pool is worth exactly 10."""
    ranges = [range(TOTAL_VALUE // c + 1) for c in counts]
    return tuple(v for v in itertools.product(*ranges) if value_of(v, counts) == TOTAL_VALUE)  # type: ignore[misc]


def format_split(split: Sequence[int]) -> str:
    """``book=1 hat=2 ball=0``."""
    return " ".join(f"{item}={n}" for item, n in zip(ITEMS, split))


def concession(counts: Split, values: Split, target: int) -> Split:
    """The split for the other side that leaves a side with ``values`` at least ``target`` (clipped to 0-10).

    The scripted rule (module docstring): the most items for the other side, then the least surplus
    over ``target``, then the first in :func:`all_splits` order.
    """
    target = min(max(target, 0), TOTAL_VALUE)

    def rank(split: Split) -> tuple[int, int]:
        return (-sum(split), value_of(values, rest(counts, split)))

    meeting = [s for s in all_splits(counts) if value_of(values, rest(counts, s)) >= target]
    return min(meeting, key=rank)


@dataclass(frozen=True)
class Opponent:
    """A scripted negotiator with private ``values`` and a ``strategy``."""

    counts: Split
    values: Split
    strategy: Strategy

    def accepts(self, split: Split, round_: int) -> bool:
        """Whether it accepts giving the agent ``split`` at ``round_``."""
        return value_of(self.values, rest(self.counts, split)) >= aspiration(self.strategy, round_)

    def counter(self, round_: int) -> Split:
        """Its proposal at ``round_`` (the split the agent would get)."""
        return concession(self.counts, self.values, aspiration(self.strategy, round_))

    def respond(self, split: Split, round_: int) -> Split | None:
        """``None`` when it accepts ``split``, else its counter-proposal."""
        return None if self.accepts(split, round_) else self.counter(round_)


@dataclass(frozen=True)
class Scenario:
    """One negotiation: the pool, both sides' values and the opponent's strategy."""

    counts: Split
    agent_values: Split
    opponent_values: Split
    strategy: Strategy

    @property
    def opponent(self) -> Opponent:
        """The scripted opponent of this scenario."""
        return Opponent(self.counts, self.opponent_values, self.strategy)

    @property
    def level(self) -> int:
        """1 conceding, 2 fair, 3 tough."""
        return STRATEGIES.index(self.strategy) + 1


def generate_scenario(seed: int, *, strategy: Strategy | None = None) -> Scenario:
    """The scenario of ``seed`` (its strategy drawn from the seed unless given)."""
    rng = random.Random(f"polyturn-negotiation-{seed}")
    drawn: Strategy = STRATEGIES[rng.randrange(len(STRATEGIES))]
    while True:
        counts: Split = (rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 5))
        vectors = value_vectors(counts)
        pairs = [(a, b) for a in vectors for b in vectors
                 if all(x + y > 0 for x, y in zip(a, b)) and any(x > 0 and y > 0 for x, y in zip(a, b))]
        if pairs:
            agent, opponent = pairs[rng.randrange(len(pairs))]
            return Scenario(counts, agent, opponent, strategy or drawn)


def parse_split(args: Mapping[str, object], counts: Split) -> Split:
    """A split from ``{"book": 1, "hat": 2, "ball": 0}`` or ``{"offer": "book=1 hat=2 ball=0"}``.

    Raises ``ValueError`` saying what was expected. ``message`` (free text to the
    other side) may come with either form and is ignored here.
    """
    form = {k: v for k, v in args.items() if k != "message"}
    if set(form) == {"offer"}:
        text = form["offer"]
        if not isinstance(text, str) or len(text) > 200:
            raise ValueError(f'Expected "offer" as text like "book=1 hat=2 ball=0", got {str(text)[:60]!r}')
        form = {}
        for part in text.replace(",", " ").split():
            match = _PAIR.fullmatch(part)
            if match is None or match.group(1).lower() in form:
                raise ValueError(f'Expected "offer" like "book=1 hat=2 ball=0", got {text[:80]!r}')
            form[match.group(1).lower()] = int(match.group(2))
    if set(form) != set(ITEMS):
        got = sorted(str(k)[:20] for k in form)
        raise ValueError(f'Expected the count you get of each of {", ".join(ITEMS)} '
                         f'(e.g. {{"book": 1, "hat": 2, "ball": 0}}), got keys {got}')
    split = []
    for item, limit in zip(ITEMS, counts):
        n = form[item]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= limit:
            raise ValueError(f"Expected {item} as a whole number from 0 to {limit} (the pool has {limit}), "
                             f"got {str(n)[:40]!r}")
        split.append(n)
    return tuple(split)  # type: ignore[return-value]


def deal_figures(scenario: Scenario, split: Split | None, *,
                 roles: tuple[str, str] = ("agent", "opponent")) -> dict[str, Any]:
    """Evaluation figures of a game's end: ``split`` is the first side's share in the deal (None: no deal).

    ``roles`` name the side holding ``scenario.agent_values`` and the other one. Returns
    ``{"deal", "worth": {role: int}, "joint", "max_joint", "pareto_optimal", "fairness"}``:
    ``joint`` is the sum of both worths (0 without a deal), ``max_joint`` the most any split gives in
    total, ``pareto_optimal`` whether no split gives one side more without giving the other less (never
    without a deal: some split gives both at least 0 and one side more), and ``fairness`` the smaller
    worth over the larger (1.0: equal, including a deal worth 0 to both; 0.0: one side got nothing of
    value; None without a deal).

    >>> s = Scenario((1, 1, 1), (5, 5, 0), (0, 5, 5), "fair")
    >>> d = deal_figures(s, (1, 0, 0))
    >>> d["worth"], d["joint"], d["max_joint"], d["pareto_optimal"], d["fairness"]
    ({'agent': 5, 'opponent': 10}, 15, 15, True, 0.5)
    >>> deal_figures(s, None)["pareto_optimal"], deal_figures(s, None)["fairness"]
    (False, None)
    """
    a_values, b_values, counts = scenario.agent_values, scenario.opponent_values, scenario.counts
    pairs = [(value_of(a_values, s), value_of(b_values, rest(counts, s))) for s in all_splits(counts)]
    if split is None:
        a, b = 0, 0
    else:
        a, b = value_of(a_values, split), value_of(b_values, rest(counts, split))
    dominated = any(x >= a and y >= b and (x, y) != (a, b) for x, y in pairs)
    return {
        "deal": split is not None,
        "worth": {roles[0]: a, roles[1]: b},
        "joint": a + b,
        "max_joint": max(x + y for x, y in pairs),
        "pareto_optimal": split is not None and not dominated,
        "fairness": None if split is None else (1.0 if max(a, b) == 0 else min(a, b) / max(a, b)),
    }
