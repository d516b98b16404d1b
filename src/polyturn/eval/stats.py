"""Small statistics for evaluation reports: intervals, tests, percentiles, bootstrap.

Every function is pure and deterministic (bootstraps take a seeded
``numpy.random.Generator``). Choices, stated once:

* proportions get the **Wilson score interval** (good coverage at small n and
  at rates near 0 or 1, where the normal "Wald" interval fails);
* two episode-level proportions (success rates) are compared with the pooled
  **two-proportion z-test**;
* two means of independent samples are compared with **Welch's t-test**
  (unequal variances);
* two policies' successes on the *same* tasks are compared with the exact
  **sign test** (McNemar's exact test) on the tasks where they differ;
* pooled ratios, means of per-turn values and percentiles are compared with
  an **unpaired bootstrap over episodes**: each policy's episodes are
  resampled independently, the difference recomputed, and the two-sided
  p-value is ``2 * min(P(diff <= 0), P(diff >= 0))``;
* corpus-level set statistics (distinct-n) use the **delete-one-episode
  jackknife** instead: resampling with replacement duplicates episodes, which
  biases a count of *unique* n-grams downwards, while leaving one episode out
  does not. Intervals are ``estimate +- 1.96 se`` and two policies are compared
  with ``z = diff / sqrt(se_a^2 + se_b^2)``.

The distributions, Welch's test, the t interval and the sign test are
``scipy.stats``'s. The Wilson interval and the pooled z-test keep their
closed forms: ties make a win count fractional, which ``binomtest`` refuses,
and scipy has no signed two-proportion z. ``tests/eval/test_stats.py`` checks
both against scipy (``binomtest(...).proportion_ci(method="wilson")``, the
2x2 ``chi2_contingency`` p) and every function against the values it gave
before the move.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from scipy import stats as _sps

T = TypeVar("T")

Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, *, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion ``successes / n`` (95% by default).

    ``successes`` may be fractional (ties counted as half a win); ``n == 0``
    gives the uninformative ``(0.0, 1.0)``.

    >>> lo, hi = wilson_interval(8, 10)
    >>> round(lo, 3), round(hi, 3)
    (0.49, 0.943)
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"Expected 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def two_proportion_z(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, float]:
    """Pooled two-proportion z-test of ``k_b/n_b - k_a/n_a`` for ``a = (k_a, n_a)``, ``b = (k_b, n_b)``.

    Returns ``(z, two-sided p)``; with no variance (both rates 0 or both 1)
    or an empty sample, ``(0.0, 1.0)``.
    """
    (k1, n1), (k2, n2) = a, b
    if n1 <= 0 or n2 <= 0:
        return 0.0, 1.0
    p1, p2 = k1 / n1, k2 / n2
    pool = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pool * (1 - pool) * (1 / n1 + 1 / n2))
    if se == 0:
        return 0.0, 1.0
    z = (p2 - p1) / se
    return z, float(2 * _sps.norm.sf(abs(z)))


def sign_test(gained: int, lost: int) -> float:
    """Exact two-sided sign test (McNemar's exact test) of paired successes on the same tasks.

    ``gained``: tasks the second policy solved and the first did not; ``lost``: the reverse. Under the null
    both are equally likely, so ``min(gained, lost)`` is Binomial(gained + lost, 1/2); ties (both solved or
    both failed) carry no information. With no differing task, 1.0.

    >>> round(sign_test(15, 4), 4), sign_test(5, 0), sign_test(0, 0)
    (0.0192, 0.0625, 1.0)
    """
    if gained < 0 or lost < 0:
        raise ValueError(f"Expected counts >= 0, got gained={gained}, lost={lost}")
    n = gained + lost
    return 1.0 if n == 0 else float(_sps.binomtest(min(gained, lost), n, 0.5).pvalue)


def welch_t(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's t-test of ``mean(b) - mean(a)``; returns ``(t, two-sided p)``.

    Fewer than two samples on either side, or zero variance on both, gives
    ``(0.0, 1.0)`` (no evidence either way) unless the means differ with zero
    variance, which gives ``(inf, 0.0)``.
    """
    x, y = np.asarray(a, float), np.asarray(b, float)
    if len(x) < 2 or len(y) < 2:
        return 0.0, 1.0
    diff = y.mean() - x.mean()
    if x.var() + y.var() == 0:  # scipy answers NaN here; the docstring's convention instead
        return (0.0, 1.0) if diff == 0 else (math.copysign(math.inf, diff), 0.0)
    with warnings.catch_warnings():  # one constant side is a valid sample, not a precision loss worth a warning
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        res = _sps.ttest_ind(y, x, equal_var=False)
    return float(res.statistic), float(res.pvalue)


def t_interval(samples: Sequence[float], *, level: float = 0.95) -> tuple[float, float] | None:
    """Student-t confidence interval of a mean; None with fewer than two samples."""
    x = np.asarray(samples, float)
    if len(x) < 2:
        return None
    if x.var() == 0:  # scipy needs a positive scale; the interval of a constant sample is the point
        return float(x.mean()), float(x.mean())
    lo, hi = _sps.t.interval(level, len(x) - 1, loc=x.mean(), scale=_sps.sem(x))
    return float(lo), float(hi)


def jackknife_se(loo: Sequence[float]) -> float | None:
    """Jackknife standard error from the ``n`` leave-one-out estimates; None with fewer than two.

    >>> round(jackknife_se([2.5, 2.0, 1.5]), 4)  # samples 1, 2, 3: the mean's s.e. is 1 / sqrt(3)
    0.5774
    """
    x = np.asarray(loo, float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n < 2:
        return None
    return float(math.sqrt((n - 1) / n * ((x - x.mean()) ** 2).sum()))


def z_from_se(diff: float, se_a: float | None, se_b: float | None) -> float | None:
    """Two-sided normal p-value of ``diff`` given the two independent standard errors; None if unknown."""
    if se_a is None or se_b is None:
        return None
    se = math.sqrt(se_a**2 + se_b**2)
    if se == 0:
        return 1.0 if diff == 0 else 0.0
    return float(2 * _sps.norm.sf(abs(diff) / se))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation); None for no values.

    >>> percentile([1, 2, 3, 4], 50)
    2.5
    """
    if not 0 <= q <= 100:
        raise ValueError(f"Expected 0 <= q <= 100, got {q}")
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, float), q))


def bootstrap_stats(
    items: Sequence[T], stat: Callable[[Sequence[T]], float | None], *, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """``stat`` on ``n_boot`` resamples (with replacement) of ``items``; NaN where it is undefined."""
    n = len(items)
    out = np.full(n_boot, np.nan)
    if n == 0:
        return out
    for b in range(n_boot):
        idx = rng.integers(0, n, n)
        v = stat([items[i] for i in idx])
        if v is not None:
            out[b] = v
    return out


def bootstrap_interval(boots: np.ndarray, *, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile interval of bootstrap replicates (NaNs ignored); None when none is defined."""
    v = boots[np.isfinite(boots)]
    if len(v) == 0:
        return None
    lo, hi = np.percentile(v, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def bootstrap_p(boots_a: np.ndarray, boots_b: np.ndarray) -> float | None:
    """Two-sided bootstrap p-value of ``b - a`` from independent replicates of each side.

    ``2 * min(P(diff <= 0), P(diff >= 0))`` over replicate pairs, capped at 1;
    None when no replicate pair is defined.
    """
    d = boots_b - boots_a
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return None
    return float(min(1.0, 2 * min((d <= 0).mean(), (d >= 0).mean())))
