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


def play_figures(records: Iterable[Mapping[str, Any]], *, few: int = 2) -> dict[str, float]:
    """How a policy plays, from its episode records: guesses a game, the share of games with no guess, and
    questions a game asked when at most ``few`` objects still fit every answer (a guess would do better then;
    with ``list_candidates`` the oracle has named them).

    Reads each step's ``action_type`` and the ``log2_candidates`` feature (objects left after the step).

    >>> step = lambda kind, left: {"info": {"action_type": kind, "features": {"log2_candidates": left}}}
    >>> play_figures([{"turns": [step("ask", 3.0), step("ask", 1.0), step("ask", 0.0), step("guess", 0.0)]}])
    {'guesses a game': 1.0, 'games without a guess': 0.0, 'questions with <= 2 objects left': 1.0}
    """
    guesses, wasted = [], []
    for record in records:
        left = float("inf")  # objects left before the turn: all of them at the start
        g = w = 0
        for turn in record.get("turns") or []:
            info = turn.get("info") or {}
            kind = info.get("action_type")
            g += kind == "guess"
            w += kind == "ask" and left <= few
            log2_left = (info.get("features") or {}).get("log2_candidates")
            if log2_left is not None:
                left = 2.0 ** float(log2_left)
        guesses.append(g)
        wasted.append(w)
    if not guesses:
        raise ValueError("Expected at least one episode record, got none")
    return {"guesses a game": fmean(guesses), "games without a guess": fmean(g == 0 for g in guesses),
            "questions with <= 2 objects left": fmean(wasted)}
