"""Training signals for the health checks: a run's records, one metric's series, its noise, window shifts.

A metric logged once per RL iteration is a mean over that iteration's
episodes, so it moves by chance. The checks (:mod:`polyturn.health.checks`)
judge every change against that chance movement:

* the **noise** of a series is the robust standard deviation of its
  iteration-to-iteration differences divided by sqrt(2)
  (``1.4826 MAD(diff) / sqrt 2``): a trend moves every difference alike and
  is removed with the median, and one outlier does not inflate it;
* a success rate's noise is at least the **binomial** noise of one
  iteration's episodes, ``sqrt(p (1 - p) / n)`` (about 0.06 for p = 0.5,
  n = 64);
* a **shift** compares the means of two adjacent windows of ``w``
  iterations; its standard error is ``noise x sqrt(2 / w)``, and ``z`` says
  how many standard errors the change is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polyturn.acting.jsonl import read_jsonl


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` that a run may still be writing.

    A last line cut mid-write (no newline yet, or not JSON yet) is left out;
    a bad line before it raises ``ValueError`` naming it.
    """
    return read_jsonl(path, partial_tail=True, missing="a metrics.jsonl written by polyturn train")


def num(v: Any) -> float | None:
    """A logged value as a float (``RunLogger`` writes non-finite floats as "nan" / "inf"); None if not a number."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def rl_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RL-update records (those with an ``iter`` and a training phase), in iteration order."""
    out = [r for r in records if "iter" in r and not str(r.get("phase", "")).startswith("eval")]
    return sorted(out, key=lambda r: r["iter"])


def series(records: Sequence[dict[str, Any]], key: str, *, finite: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(iters, values)`` of ``key`` over the RL records that have it (non-finite values dropped if ``finite``)."""
    xs, ys = [], []
    for r in rl_records(records):
        v = num(r.get(key))
        if v is None or (finite and not math.isfinite(v)):
            continue
        xs.append(int(r["iter"]))
        ys.append(v)
    return np.array(xs, int), np.array(ys, float)


def aligned(records: Sequence[dict[str, Any]], *keys: str) -> tuple[np.ndarray, ...]:
    """``(iters, values_1, ..., values_k)`` over the iterations where every key is logged."""
    pairs = [series(records, k) for k in keys]
    common = pairs[0][0]
    for it, _ in pairs[1:]:
        common = np.intersect1d(common, it)
    return (common, *[y[np.isin(it, common)] for it, y in pairs])


def robust_sd(values: Sequence[float]) -> float:
    """``1.4826 x MAD``; with MAD = 0 (a mostly constant series), ``1.2533 x mean |x - median|``."""
    x = np.asarray(values, float)
    if len(x) == 0:
        return 0.0
    dev = np.abs(x - np.median(x))
    mad = float(np.median(dev))
    return 1.4826 * mad if mad > 0 else 1.253314 * float(dev.mean())


def noise_sd(values: Sequence[float]) -> float:
    """Iteration-to-iteration noise of a series: ``robust_sd(diff) / sqrt 2`` (0 for fewer than 3 values)."""
    x = np.asarray(values, float)
    return robust_sd(np.diff(x)) / math.sqrt(2) if len(x) >= 3 else 0.0


def binomial_sd(rate: float, n: int) -> float:
    """Noise of a rate over ``n`` episodes, ``sqrt(p (1-p) / n)``, with p kept off 0 and 1 by half an episode.

    >>> round(binomial_sd(0.5, 64), 4)
    0.0625
    """
    p = min(max(rate, 0.5 / n), 1 - 0.5 / n)
    return math.sqrt(p * (1 - p) / n)


def episodes_per_iter(records: Sequence[dict[str, Any]]) -> int | None:
    """Episodes behind each iteration's means (``charts/episodes``, median over iterations); None if not logged."""
    _, n = series(records, "charts/episodes")
    return int(np.median(n)) if len(n) else None


def rate_sd(records: Sequence[dict[str, Any]], values: Sequence[float]) -> float:
    """Noise of a logged rate: its series noise, and at least the binomial noise where the episode count is known."""
    n = episodes_per_iter(records)
    sd = noise_sd(values)
    if n:
        sd = max(sd, binomial_sd(float(np.mean(values)) if len(values) else 0.5, n))
    return sd


@dataclass(frozen=True)
class Shift:
    """Means of ``y`` over two adjacent windows, their change, and the change's standard error."""

    before: float
    after: float
    se: float

    @property
    def change(self) -> float:
        """``after - before``."""
        return self.after - self.before

    @property
    def z(self) -> float:
        """The change in standard errors (inf for a change in a noiseless series)."""
        if self.se > 0:
            return self.change / self.se
        return 0.0 if self.change == 0 else math.copysign(math.inf, self.change)


def shift(y: np.ndarray, start: int, window: int, sd: float, *, before: int | None = None) -> Shift:
    """Window ``y[start - before:start]`` (``before`` defaults to ``window``) against ``y[start:start + window]``,
    with per-iteration noise ``sd``."""
    before = window if before is None else before
    a, b = y[start - before : start], y[start : start + window]
    return Shift(float(a.mean()), float(b.mean()), sd * math.sqrt(1.0 / len(a) + 1.0 / len(b)))


@dataclass(frozen=True)
class Rise:
    """A metric's rise between two windows while success did not rise: the split ``s``, the first window's length,
    both shifts, and how many splits showed it."""

    s: int
    before: int
    metric: Shift
    success: Shift
    windows: int


def rise_without_success(records: Sequence[dict[str, Any]], key: str, *, floor: float, window: int, z_warn: float,
                         success_z: float) -> tuple[np.ndarray, Rise | None]:
    """``(iters, rise)``: the split where ``key`` rose most (>= ``z_warn`` s.e. and >= ``floor``) between a window
    before it and ``window`` iterations after, while ``charts/success_rate`` did not rise by ``success_z`` s.e.;
    None when no split did. The window before a split may be as short as ``window // 2 + 1`` iterations at the
    start of the run, so a rise in the first iterations is compared with the few iterations before it."""
    it, y, succ = aligned(records, key, "charts/success_rate")
    first = window // 2 + 1
    if len(it) < first + window:
        return it, None
    sd_y, sd_s = noise_sd(y), rate_sd(records, succ)
    hits = []
    for s in range(first, len(it) - window + 1):
        w_before = min(window, s)
        t, p = shift(y, s, window, sd_y, before=w_before), shift(succ, s, window, sd_s, before=w_before)
        if t.z >= z_warn and t.change >= floor and p.z < success_z:
            hits.append((s, w_before, t, p))
    if not hits:
        return it, None
    s, w_before, t, p = max(hits, key=lambda h: h[2].z)
    return it, Rise(s, w_before, t, p, len(hits))


def reward_scale(records: Sequence[dict[str, Any]]) -> float:
    """The size of what an episode is paid for its outcome: median over iterations of ``sum |reward/outcome/*|``.

    Falls back to the median ``|charts/return_mean|``, then 1. Changes in
    reward terms smaller than a share of this are too small to matter.
    """
    rl = rl_records(records)
    outs = [sum(abs(num(v) or 0.0) for k, v in r.items() if k.startswith("reward/outcome/")) for r in rl]
    outs = [o for o in outs if o > 0 and math.isfinite(o)]
    if outs:
        return float(np.median(outs))
    _, ret = series(records, "charts/return_mean")
    scale = float(np.median(np.abs(ret))) if len(ret) else 0.0
    return scale if scale > 0 else 1.0


def action_diversity(actions_per_episode: Sequence[Sequence[str]]) -> dict[str, float]:
    """How varied one iteration's episodes are, from each episode's action texts.

    ``charts/distinct_action_frac``: distinct action texts over all actions;
    ``charts/repeated_episode_frac``: episodes whose whole action sequence
    another episode of the batch also played.

    >>> d = action_diversity([["a", "b"], ["a", "b"], ["a", "c"]])
    >>> round(d["charts/distinct_action_frac"], 3), round(d["charts/repeated_episode_frac"], 3)
    (0.5, 0.667)
    """
    from collections import Counter

    actions = [a for ep in actions_per_episode for a in ep]
    counts = Counter(tuple(ep) for ep in actions_per_episode)
    n = max(1, len(actions_per_episode))
    return {"charts/distinct_action_frac": len(set(actions)) / max(1, len(actions)),
            "charts/repeated_episode_frac": sum(c for c in counts.values() if c > 1) / n}
