"""Lagrange multipliers (PPO-Lagrangian): the projected update, the penalised advantage and rft's cost weights,
against numbers worked out by hand."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos import lagrange
from polyturn.algos.lagrange import cost_weights, lagrange_update, lagrangian_advantages

F64 = torch.float64


def test_update_against_a_hand_computation():
    # violation: 0.3 + 0.2 * (0.6 - 0.1) = 0.4; error_response: 0.05 + 0.2 * (0.5 - 1.0) = -0.05 -> 0;
    # sandbox: 4.9 + 0.2 * (2.0 - 0.0) = 5.3 -> clipped to 5.0
    lam = lagrange_update(torch.tensor([0.3, 0.05, 4.9], dtype=F64), torch.tensor([0.6, 0.5, 2.0], dtype=F64),
                          torch.tensor([0.1, 1.0, 0.0], dtype=F64), lr=0.2, max_value=5.0)
    assert_close(lam, torch.tensor([0.4, 0.0, 5.0], dtype=F64))


def test_update_over_iterations_rises_while_over_the_limit_then_falls_back():
    lam, seen = torch.zeros(1, dtype=F64), []
    for cost in (0.5, 0.5, 0.0, 0.0, 0.0):
        lam = lagrange_update(lam, torch.tensor([cost], dtype=F64), torch.tensor([0.1], dtype=F64), lr=1.0,
                              max_value=10.0)
        seen.append(round(float(lam), 10))
    assert seen == [0.4, 0.8, 0.7, 0.6, 0.5]


def test_zero_lr_keeps_the_multipliers():
    lam = torch.tensor([0.7], dtype=F64)
    assert_close(lagrange_update(lam, torch.tensor([3.0], dtype=F64), torch.tensor([0.0], dtype=F64), lr=0.0,
                                 max_value=1.0), lam)


def test_lagrangian_advantages_by_hand():
    adv = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 0.0]], dtype=F64)
    cost_adv = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]],  # violation
                             [[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]]], dtype=F64)  # error_response
    got = lagrangian_advantages(adv, cost_adv, torch.tensor([2.0, 0.5], dtype=F64))
    # [1 - 2*1 - 0.5*0.5, 2 - 0 - 0.25, 0], [0.5 - 0 + 0.5, -1 - 4 - 0, 0]
    assert_close(got, torch.tensor([[-1.25, 1.75, 0.0], [1.0, -5.0, 0.0]], dtype=F64))
    assert_close(lagrangian_advantages(adv, cost_adv, torch.zeros(2, dtype=F64)), adv)  # lambda 0: unconstrained


def test_cost_weights_by_hand():
    costs = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 3.0]], dtype=F64)
    assert_close(cost_weights(costs, torch.tensor([0.5, 0.2], dtype=F64)), torch.tensor([1.0, 0.8, 0.0], dtype=F64))
    assert_close(cost_weights(costs, torch.zeros(2, dtype=F64)), torch.ones(3, dtype=F64))


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="Expected costs to have shape"):
        lagrange_update(torch.zeros(2), torch.zeros(3), torch.zeros(2), lr=0.1, max_value=1.0)
    with pytest.raises(ValueError, match="Expected lr >= 0"):
        lagrange_update(torch.zeros(2), torch.zeros(2), torch.zeros(2), lr=-0.1, max_value=1.0)
    with pytest.raises(ValueError, match="Expected cost_adv to have shape"):
        lagrangian_advantages(torch.zeros(2, 3), torch.zeros(1, 2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="Expected costs of shape"):
        cost_weights(torch.zeros(4, 2), torch.zeros(3))


def test_doctests():
    assert doctest.testmod(lagrange).failed == 0
