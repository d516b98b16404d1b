"""LMRL-Gym's normalised score for Twenty Questions.

LMRL-Gym reports a policy's mean return on a scale where 0 is the minimum
return, 50 the demonstration data's average return and 100 the maximum
return. With three anchors the scale is piecewise linear: returns between
the minimum and the demonstrations' mean map onto 0..50, returns between
that mean and the maximum onto 50..100.

The return used is the game's own (:func:`game_return`): -1 for every turn
except the turn of the correct guess, whatever shaping weights a run used,
so the minimum is ``-max_turns`` (never guessed) and the maximum 0 (right on
the first turn).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import Any


def game_return(record: Mapping[str, Any]) -> float:
    """The LMRL-Gym return of an episode record: minus the turns that were not the correct guess."""
    turns = len(record["turns"])
    return -float(turns - (1 if record.get("success") else 0))


def normalised_score(mean_return: float, *, demo_mean: float, min_return: float = -20.0,
                     max_return: float = 0.0) -> float:
    """``mean_return`` on LMRL-Gym's scale (0 = min, 50 = demonstrations' mean, 100 = max).

    >>> normalised_score(-20.0, demo_mean=-12.0), normalised_score(-12.0, demo_mean=-12.0)
    (0.0, 50.0)
    >>> normalised_score(-6.0, demo_mean=-12.0), normalised_score(0.0, demo_mean=-12.0)
    (75.0, 100.0)
    """
    if not min_return < demo_mean < max_return:
        raise ValueError(f"Expected min_return < demo_mean < max_return, got {min_return}, {demo_mean}, {max_return}")
    if mean_return <= demo_mean:
        return 50.0 * (mean_return - min_return) / (demo_mean - min_return)
    return 50.0 + 50.0 * (mean_return - demo_mean) / (max_return - demo_mean)


def score_records(records: Iterable[Mapping[str, Any]], demos: Iterable[Mapping[str, Any]], *,
                  max_turns: int = 20) -> float:
    """The normalised score of ``records`` with ``demos`` (e.g. the BC data) as the 50 anchor."""
    demo_mean = fmean(game_return(r) for r in demos)
    return normalised_score(fmean(game_return(r) for r in records), demo_mean=demo_mean,
                            min_return=-float(max_turns), max_return=0.0)
