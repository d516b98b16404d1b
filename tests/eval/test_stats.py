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


@pytest.mark.parametrize("module", ["eval.stats", "eval.metrics", "health.checks", "eval.clusters", "eval.preference",
                                    "eval.testcases", "eval.diagnose"])
def test_doctests(module):
    mod = importlib.import_module(f"polyturn.{module}")
    result = doctest.testmod(mod)
    assert result.attempted > 0 and result.failed == 0


# ---- today's values, recorded before the tests and intervals moved onto scipy.stats ------------------------
# Recorded with the hand-written formulas at commit 8707c16; every later implementation must give them again.
_WILSON = [
    (0, 1, (0.0, 0.7934506856227626)), (1, 1, (0.20654931437723745, 1.0)), (0, 20, (0.0, 0.16112515805281938)),
    (3, 10, (0.10779126740630099, 0.6032218525388546)), (6.5, 11, (0.31613630904591156, 0.8186213333235373)),
    (8, 10, (0.49016247153664183, 0.9433178485456247)), (20, 20, (0.8388748419471806, 1.0)),
    (37, 200, (0.13730192800616042, 0.2445706276115175)), (450, 1000, (0.4194153840742968, 0.4809672917742588)),
]
_Z = [
    ((30, 100), (50, 100), (2.886751345948129, 0.003892417122778628)),
    ((12, 200), (9, 200), (-0.6725460061723616, 0.5012361619989445)),
    ((81, 200), (129, 200), (4.806011273488886, 1.5397122063697518e-06)),
    ((5.5, 10), (1, 4), (-1.0167822548835883, 0.3092570255501045)),
]
_X = [[0.5, 1.25, 2.0, 3.5, 0.75], [1.5, 2.25, 4.0, 2.5], [3, 3, 3.5], [1, 1, 1, 1]]
_WELCH = [
    (0, 1, (1.2793710495812665, 0.2420542230619512)), (1, 0, (-1.2793710495812665, 0.2420542230619512)),
    (0, 2, (2.7737183126966842, 0.041798270452313574)), (2, 3, (-12.999999999999998, 0.005865153227565683)),
]
_TINT = [(0.10161968722590697, 3.0983803127740934), (0.8944014588753271, 4.230598541124673),
         (2.4495578783750895, 3.8837754549582435), (1.0, 1.0)]


@pytest.mark.parametrize(("k", "n", "want"), _WILSON)
def test_wilson_gives_todays_values(k, n, want):
    assert S.wilson_interval(k, n) == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("k", "n", "want"), [w for w in _WILSON if float(w[0]).is_integer()])
def test_wilson_equals_scipys_for_whole_counts(k, n, want):
    # scipy's binomtest takes whole counts only; ties counted as half a win keep the closed form.
    ci = sps.binomtest(int(k), n).proportion_ci(confidence_level=0.95, method="wilson")
    assert (ci.low, ci.high) == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("a", "b", "want"), _Z)
def test_two_proportion_z_gives_todays_values_and_scipys_chi2_p(a, b, want):
    assert S.two_proportion_z(a, b) == pytest.approx(want, rel=1e-12)
    table = [[a[0], a[1] - a[0]], [b[0], b[1] - b[0]]]  # the pooled z-test is the 2x2 chi-square test, z^2 = chi2
    assert sps.chi2_contingency(table, correction=False).pvalue == pytest.approx(want[1], rel=1e-9)


@pytest.mark.parametrize(("i", "j", "want"), _WELCH)
def test_welch_gives_todays_values(i, j, want):
    assert S.welch_t(_X[i], _X[j]) == pytest.approx(want, rel=1e-12)


def test_t_interval_gives_todays_values():
    assert [S.t_interval(x) for x in _X] == [pytest.approx(w, rel=1e-12) for w in _TINT]
    assert S.t_interval(_X[0], level=0.9) == pytest.approx((0.44949381909173125, 2.750506180908269), rel=1e-12)
    assert S.t_interval([1.0]) is None
    assert S.z_from_se(0.12, 0.05, 0.07) == pytest.approx(0.1630243843065705, rel=1e-12)
