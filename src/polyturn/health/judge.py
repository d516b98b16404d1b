"""The hacking guard of an LLM judge's reward (config ``judge``, docs/judge.md): its score rising while success does
not.

A judge pays for what it believes a good episode looks like; a policy trained on it can learn to please the judge
instead of doing the task. Training episodes end with a known outcome, so the trainer logs the judge's mean score
(``judge/score_mean``, in [0, 1]) beside the success rate, and its agreement with the outcome (``judge/agreement``,
``judge/auc``). :func:`check_judge_hacking` warns when the score rises by ``JUDGE_Z`` = 3 s.e. and by at least
``JUDGE_MIN_RISE`` = 0.1 of its scale between two windows while the success rate does not rise by 1 s.e.; the
message shows how the agreement moved over the same windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from polyturn.health.signals import rise_without_success, series
from polyturn.health.warning import TrainingWarning
from polyturn.health.warning import warning as _w

#: The warning's kind (``judge.guard: drop`` acts on it).
KIND = "judge_hacking"
#: The judge's score metrics, preferred first: its mean score in [0, 1], else its reward term (scale: its largest).
SCORE_KEYS = ("judge/score_mean", "reward/judge/score")
JUDGE_Z = 3.0
JUDGE_MIN_RISE = 0.1
JUDGE_SUCCESS_Z = 1.0
WINDOW = 5


def _window_mean(records: Sequence[dict[str, Any]], key: str, a: int, b: int) -> float | None:
    it, y = series(records, key)
    keep = (it >= a) & (it <= b)
    return float(y[keep].mean()) if keep.any() else None


def check_judge_hacking(records: Sequence[dict[str, Any]], *, window: int = WINDOW, z_warn: float = JUDGE_Z,
                        min_rise: float = JUDGE_MIN_RISE, success_z: float = JUDGE_SUCCESS_Z) -> list[TrainingWarning]:
    """A warning when the LLM judge's score rose far beyond its noise while the success rate did not rise."""
    key = next((k for k in SCORE_KEYS if len(series(records, k)[1])), None)
    if key is None:
        return []
    scale = 1.0 if key == SCORE_KEYS[0] else max(float(np.abs(series(records, key)[1]).max()), 1e-12)
    it, r = rise_without_success(records, key, floor=min_rise * scale, window=window, z_warn=z_warn,
                                 success_z=success_z)
    if r is None:
        return []
    t, p = r.metric, r.success
    a0, a1, b0, b1 = int(it[r.s - r.before]), int(it[r.s - 1]), int(it[r.s]), int(it[min(len(it), r.s + window) - 1])
    agree = [_window_mean(records, "judge/agreement", a0, a1), _window_mean(records, "judge/agreement", b0, b1)]
    said = (f"; the judge's agreement with the outcome went {agree[0]:.3f} -> {agree[1]:.3f}"
            if None not in agree else "")
    return [_w(KIND, key,
               f"the LLM judge's {key} rose {t.before:.3g} -> {t.after:.3g} ({t.change:+.3g}, {t.z:.1f} s.e.) from "
               f"iterations {a0}-{a1} to {b0}-{b1}, while the success rate went {p.before:.3f} -> {p.after:.3f} "
               f"({p.z:+.1f} s.e.){said}: the policy may be pleasing the judge, not doing the task",
               a0, b1, score_before=t.before, score_after=t.after, score_z=t.z, success_before=p.before,
               success_after=p.after, success_z=p.z, agreement_before=agree[0], agreement_after=agree[1],
               windows=r.windows)]
