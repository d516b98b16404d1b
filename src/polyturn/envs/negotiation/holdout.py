"""Held-out partners for evaluating Negotiation policies: strategies no training path can reach.

EVALUATION ONLY. Nothing in an env's kwargs, a reset option, a training config
or any other string option selects these players: the env knows only
``opponent="scripted"`` (the :mod:`.game` strategies) and ``opponent="self"``,
and training samples partners from :data:`.players.TRAIN_PLAYERS` (the spec's
``partners``). Only Python code that imports this module (evaluation does,
through the spec's ``holdout_partners``) can seat them, so a score against them
measures play against partners the policy never met.

* :class:`TitForTat` opens with a demanding split, then mirrors the other side:
  it gives up as much worth (in its own values) as the other side gave it since
  its own previous proposal, never below a floor, and accepts a standing
  proposal worth at least what it would propose next.
* :class:`RandomConcession` lowers its aspiration by a random amount each round
  (drawn from the ``rng`` it is given) and otherwise plays like
  :class:`.players.ScriptedNegotiator`.

Both are deterministic given the views and the ``rng``. A player object plays
one game at a time (it starts over when it has made no proposal yet); make one
per game from :data:`HOLDOUT_PLAYERS`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from polyturn.envs.actions import format_action
from polyturn.envs.negotiation.game import TOTAL_VALUE
from polyturn.envs.negotiation.players import ScriptedPlayer, own_target, propose, worth


class TitForTat:
    """Concedes as much as the other side conceded (measured in its own values), from ``opening`` down to ``floor``.

    Its first proposal keeps ``opening``. Each later one keeps its previous target minus the
    worth the other side's latest proposal gives it over the other side's latest proposal at its
    previous proposal (0 when the other side did not concede or had not proposed), never below
    ``floor``. It accepts a standing proposal worth at least what it would propose next. It draws
    nothing from ``rng``.
    """

    def __init__(self, *, opening: int = 9, floor: int = 5) -> None:
        if not 0 <= floor <= opening <= TOTAL_VALUE:
            raise ValueError(f"Expected 0 <= floor <= opening <= {TOTAL_VALUE}, got floor={floor}, opening={opening}")
        self.opening, self.floor = opening, floor
        self.name = "tit-for-tat"
        self._target = opening
        self._seen = 0  # how many proposals the other side had made at its previous proposal

    def next_target(self, view: Mapping[str, Any]) -> int:
        """The worth its next proposal keeps, given the other side's proposals so far."""
        if not view["my_proposals"]:
            return self.opening
        theirs = view["their_proposals"]
        conceded = 0
        if 0 < self._seen < len(theirs):
            conceded = worth(view, theirs[-1]) - worth(view, theirs[self._seen - 1])
        return max(self.floor, self._target - max(0, conceded))

    def act(self, view: Mapping[str, Any], rng: random.Random) -> str:
        """Accept a standing proposal at least as good as its next one; else make that one."""
        target = self.next_target(view)
        share = own_target(view, target)
        standing = view["standing"]
        if standing is not None and worth(view, standing) >= worth(view, share):
            return format_action("accept", {})
        self._target, self._seen = target, len(view["their_proposals"])
        return propose(share)


class RandomConcession:
    """An aspiration that starts at ``start`` and falls by ``rng.randint(0, max_fall)`` each round, not below
    ``floor``; it accepts and proposes like :class:`.players.ScriptedNegotiator` at that aspiration."""

    def __init__(self, *, start: int = 9, floor: int = 3, max_fall: int = 2) -> None:
        if not 0 <= floor <= start <= TOTAL_VALUE or max_fall < 0:
            raise ValueError(f"Expected 0 <= floor <= start <= {TOTAL_VALUE} and max_fall >= 0, got floor={floor}, "
                             f"start={start}, max_fall={max_fall}")
        self.start, self.floor, self.max_fall = start, floor, max_fall
        self.name = "random-concession"
        self._aspirations = [start]

    def aspiration(self, round_: int, rng: random.Random) -> int:
        """Its aspiration at ``round_`` (its proposals so far), drawing the falls it has not drawn yet."""
        if round_ == 0:
            self._aspirations = [self.start]
        while len(self._aspirations) <= round_:
            self._aspirations.append(max(self.floor, self._aspirations[-1] - rng.randint(0, self.max_fall)))
        return self._aspirations[round_]

    def act(self, view: Mapping[str, Any], rng: random.Random) -> str:
        """Accept a standing proposal worth its aspiration; else propose the split that keeps it."""
        target = self.aspiration(view["round"], rng)
        standing = view["standing"]
        if standing is not None and worth(view, standing) >= target:
            return format_action("accept", {})
        return propose(own_target(view, target))


#: Evaluation-only partners (name -> a fresh player); see the module docstring.
HOLDOUT_PLAYERS: dict[str, Callable[[], ScriptedPlayer]] = {
    "tit_for_tat": TitForTat,
    "random_concession": RandomConcession,
}
