"""Intervals and tests against hand-computed and scipy reference values."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest
from scipy import stats as sps

from polyturn.eval import stats as S


def test_wilson_interval_matches_the_closed_form():
    # p = 0.8, n = 10, z = 1.96: the textbook Wilson interval is (0.4902, 0.9433).
    lo, hi = S.wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4)
    assert hi == pytest.approx(0.9433, abs=1e-4)


def test_wilson_interval_edges():
    lo, hi = S.wilson_interval(0, 20)
    assert lo == 0.0 and 0.0 < hi < 0.2  # never the degenerate [0, 0] of the Wald interval
    lo, hi = S.wilson_interval(20, 20)
    assert hi == 1.0 and 0.8 < lo < 1.0
    assert S.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="Expected 0 <= successes <= n"):
        S.wilson_interval(5, 3)


def test_wilson_interval_narrows_with_n():
    w_small = np.subtract(*S.wilson_interval(5, 10)[::-1])
    w_big = np.subtract(*S.wilson_interval(500, 1000)[::-1])
    assert w_big < w_small / 5


def test_two_proportion_z_by_hand():
    # 30/100 vs 50/100: pooled p = 0.4, se = sqrt(0.4*0.6*0.02) = 0.069282, z = 0.2 / se = 2.8868
    z, p = S.two_proportion_z((30, 100), (50, 100))
    assert z == pytest.approx(2.8868, abs=1e-4)
    assert p == pytest.approx(2 * sps.norm.sf(2.8868), rel=1e-3)
    assert S.two_proportion_z((0, 10), (0, 10)) == (0.0, 1.0)


def test_welch_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 30), rng.normal(0.8, 2, 20)
    t, p = S.welch_t(a, b)
    ref = sps.ttest_ind(b, a, equal_var=False)
    assert t == pytest.approx(ref.statistic, rel=1e-9)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)
    assert S.welch_t([1.0], [2.0, 3.0]) == (0.0, 1.0)


def test_percentiles():
    lat = [0.1] * 98 + [1.0, 2.0]
    assert S.percentile(lat, 50) == pytest.approx(0.1)
    assert S.percentile(lat, 99) == pytest.approx(1.01)  # linear interpolation between 1.0 and 2.0
    assert S.percentile([], 50) is None


def test_jackknife_se_of_a_mean_equals_the_standard_error():
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    loo = [(x.sum() - v) / (len(x) - 1) for v in x]
    assert S.jackknife_se(loo) == pytest.approx(x.std(ddof=1) / np.sqrt(len(x)))


def test_bootstrap_p_detects_a_shift_and_not_its_absence():
    rng = np.random.default_rng(1)
    a = S.bootstrap_stats(list(rng.normal(0, 1, 60)), np.mean, n_boot=400, rng=rng)
    b = S.bootstrap_stats(list(rng.normal(1, 1, 60)), np.mean, n_boot=400, rng=rng)
    c = S.bootstrap_stats(list(rng.normal(0, 1, 60)), np.mean, n_boot=400, rng=rng)
    assert S.bootstrap_p(a, b) < 0.01
    assert S.bootstrap_p(a, c) > 0.05


@pytest.mark.parametrize("module", ["stats", "metrics", "checks", "clusters", "preference", "testcases", "diagnose"])
def test_doctests(module):
    mod = importlib.import_module(f"polyturn.eval.{module}")
    result = doctest.testmod(mod)
    assert result.attempted > 0 and result.failed == 0
