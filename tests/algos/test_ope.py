"""Off-policy estimators against hand computations: clipped per-decision weights, per-decision WIS, weighted doubly
robust, effective sample size, the bootstrap interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polyturn.algos.ope import (
    bootstrap_interval,
    effective_sample_size,
    log_weights,
    per_decision_wis,
    weighted_doubly_robust,
)

# Two episodes: the first of two turns (ratios 2 and 3), the second of one turn (ratio 0.5).
LOG_RATIOS = np.log(np.array([[2.0, 3.0], [0.5, 1.0]]))
MASK = np.array([[True, True], [True, False]])
REWARDS = np.array([[1.0, 2.0], [3.0, 0.0]])
VALUES = np.array([[4.0, 3.0], [2.0, 0.0]])


def test_weights_are_clipped_products_carried_past_the_end():
    w = np.exp(log_weights(LOG_RATIOS, MASK, clip=5.0))
    np.testing.assert_allclose(w, [[2.0, 5.0], [0.5, 0.5]])  # 2 * 3 = 6 clipped to 5; episode 2 keeps 0.5
    np.testing.assert_allclose(np.exp(log_weights(LOG_RATIOS, MASK, clip=100.0)), [[2.0, 6.0], [0.5, 0.5]])
    with pytest.raises(ValueError, match="clip > 0"):
        log_weights(LOG_RATIOS, MASK, clip=0.0)


def test_per_decision_wis_by_hand():
    lw = log_weights(LOG_RATIOS, MASK, clip=5.0)
    # step 0: (2*1 + 0.5*3) / 2.5 = 1.4; step 1: (5*2 + 0.5*0) / 5.5
    assert per_decision_wis(lw, REWARDS) == pytest.approx(1.4 + 10 / 5.5)


def test_weighted_doubly_robust_by_hand():
    lw = log_weights(LOG_RATIOS, MASK, clip=5.0)
    wn0, wn1 = np.array([0.8, 0.2]), np.array([5 / 5.5, 0.5 / 5.5])
    step0 = wn0 @ REWARDS[:, 0] - (wn0 - 0.5) @ VALUES[:, 0]  # 1.4 - (0.3*4 - 0.3*2) = 0.8
    step1 = wn1 @ REWARDS[:, 1] - (wn1 - wn0) @ VALUES[:, 1]
    assert step0 == pytest.approx(0.8)
    assert weighted_doubly_robust(lw, REWARDS, VALUES) == pytest.approx(step0 + step1)


def test_equal_weights_give_the_mean_return_whatever_the_critic():
    lw = np.zeros((2, 2))
    mean_return = REWARDS.sum(1).mean()
    assert per_decision_wis(lw, REWARDS) == pytest.approx(mean_return)
    assert weighted_doubly_robust(lw, REWARDS, VALUES) == pytest.approx(mean_return)
    assert weighted_doubly_robust(lw, REWARDS, -7 * VALUES) == pytest.approx(mean_return)


def test_a_perfect_critic_cancels_the_tasks_noise():
    """One turn on tasks of two kinds: an easy task pays 1 more whatever the action, and action 1 pays 0.5 more than
    action 0. Behaviour 50/50, target 90/10 on action 1: the target's value is 0.5 + 0.45 = 0.95. A critic that
    knows V(s) under the target (1.45 easy, 0.45 hard) removes the noise of which tasks drew large weights: WIS's
    task noise is the sample mean's times E[w^2] (1.64 here), WDR's only the sample mean's, so over
    many samples of 10 its squared error is about 0.6 of WIS's."""
    rng = np.random.default_rng(0)
    errs_wis, errs_dr = [], []
    for _ in range(300):
        easy, a = rng.integers(0, 2, size=10), rng.integers(0, 2, size=10)
        lw = np.log(np.where(a == 1, 0.9 / 0.5, 0.1 / 0.5))[:, None]
        r = (easy + 0.5 * a)[:, None].astype(float)
        errs_wis.append(per_decision_wis(lw, r) - 0.95)
        errs_dr.append(weighted_doubly_robust(lw, r, (easy + 0.45)[:, None].astype(float)) - 0.95)
    assert np.mean(np.square(errs_dr)) < 0.7 * np.mean(np.square(errs_wis))


def test_far_policies_underflow_no_weight():
    lw = log_weights(np.array([[-2000.0], [-2001.0]]), np.ones((2, 1), dtype=bool), clip=10.0)
    est = per_decision_wis(lw, np.array([[1.0], [0.0]]))
    assert est == pytest.approx(math.e / (1 + math.e))  # the weights' ratio e : 1 survives in log space


def test_effective_sample_size():
    assert effective_sample_size(np.zeros(7)) == pytest.approx(7.0)
    assert effective_sample_size(np.log([5.0, 0.5])) == pytest.approx(5.5**2 / 25.25)
    assert effective_sample_size(np.array([0.0, -1000.0, -1000.0])) == pytest.approx(1.0)


def test_bootstrap_interval_of_a_mean():
    x = np.random.default_rng(1).normal(size=400)
    lo, hi = bootstrap_interval(lambda ix: float(x[ix].mean()), len(x), n_resamples=1000, seed=0)
    assert lo < x.mean() < hi
    assert hi - lo == pytest.approx(2 * 1.96 * x.std() / 20, rel=0.15)  # the normal interval's width
    lo90, hi90 = bootstrap_interval(lambda ix: float(x[ix].mean()), len(x), confidence=0.9, n_resamples=1000)
    assert hi90 - lo90 < hi - lo
    with pytest.raises(ValueError, match="at least 2 episodes"):
        bootstrap_interval(lambda ix: 0.0, 1)


def test_doctests():
    import doctest

    from polyturn.algos import ope

    assert doctest.testmod(ope).failed == 0
