"""Scripted players for the self-play Negotiation game: a seat a script fills instead of a policy.

A player reads its role's :meth:`~.selfplay.NegotiationSelfPlayEnv.role_view`
(its own values, the other side's standing proposal, its round, ...) and
writes an action text, as a policy would. :class:`ScriptedNegotiator` plays
:class:`.game.Opponent`'s rule from its own side, so a self-play game with one
in the ``second`` seat is the single-agent game against that strategy, text for
text (tests/envs/test_negotiation_selfplay.py). :data:`TRAIN_PLAYERS` are the
partners training may sample; held-out partners for evaluation live in
:mod:`.holdout`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from polyturn.envs.actions import format_action
from polyturn.envs.negotiation.game import ITEMS, STRATEGIES, Split, Strategy, aspiration, concession, rest, value_of


class ScriptedPlayer(Protocol):
    """What fills a role in place of a policy: ``act(role_view, rng) -> action text``."""

    name: str

    def act(self, view: Mapping[str, Any], rng: random.Random) -> str:
        """The next action text (e.g. ``format_action("accept", {})``) for the role whose ``view`` this is."""
        ...


def propose(share: Split, thought: str | None = None) -> str:
    """The action text proposing ``share`` (the proposer's counts)."""
    return format_action("propose", dict(zip(ITEMS, share)), thought)


def worth(view: Mapping[str, Any], share: Split | None) -> int:
    """What ``share`` is worth to the role of ``view`` (0 for None)."""
    return 0 if share is None else value_of(view["values"], share)


def own_target(view: Mapping[str, Any], target: int) -> Split:
    """The share the role proposes to keep ``target``: :func:`.game.concession` from its own side."""
    return rest(view["counts"], concession(view["counts"], view["values"], target))


class ScriptedNegotiator:
    """:class:`.game.Opponent`'s rule as a player, for ``strategy`` in ``conceding`` / ``fair`` / ``tough``.

    It accepts the standing proposal when it leaves it at least its aspiration at its round (the
    number of proposals it has made); otherwise it proposes the split ``Opponent.counter`` gives
    at that round, from its own side (so, opening, ``counter(0)``). It draws nothing from ``rng``.
    """

    def __init__(self, strategy: Strategy) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"Expected a strategy among {STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        self.name = f"scripted-{strategy}"

    def act(self, view: Mapping[str, Any], rng: random.Random) -> str:
        """Accept or counter-propose by the strategy's aspiration at ``view["round"]``."""
        target = aspiration(self.strategy, view["round"])
        standing = view["standing"]
        if standing is not None and worth(view, standing) >= target:
            return format_action("accept", {})
        return propose(own_target(view, target))


#: The partners a training run may sample (name -> a fresh player).
TRAIN_PLAYERS: dict[str, Callable[[], ScriptedPlayer]] = {
    strategy: partial(ScriptedNegotiator, strategy) for strategy in STRATEGIES
}
