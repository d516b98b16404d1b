"""group_relative_advantages: RLOO / GRPO baselines over episodes of the same task."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos import group_relative_advantages

F64 = torch.float64
RETURNS = torch.tensor([1.0, 2.0, 3.0, 10.0, 5.0, 9.0], dtype=F64)
GROUPS = torch.tensor([7, 7, 7, 3, 9, 9])  # task 7 three times, task 3 once, task 9 twice


def test_leave_one_out():
    adv = group_relative_advantages(RETURNS, GROUPS)
    # task 7: 1 - (2+3)/2 = -1.5 ; 2 - (1+3)/2 = 0 ; 3 - (1+2)/2 = 1.5
    # task 3: alone -> 0 ; task 9: 5 - 9 = -4 ; 9 - 5 = 4
    assert_close(adv, torch.tensor([-1.5, 0.0, 1.5, 0.0, -4.0, 4.0], dtype=F64))


def test_group_mean():
    adv = group_relative_advantages(RETURNS, GROUPS, leave_one_out=False)
    # task 7 mean 2 ; task 9 mean 7
    assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, -2.0, 2.0], dtype=F64))


def test_std_normalized():
    adv = group_relative_advantages(RETURNS, GROUPS, leave_one_out=False, normalize_std=True, eps=1e-12)
    # task 7: sample std sqrt((1 + 0 + 1) / 2) = 1 ; task 9: sqrt((4 + 4) / 1) = 2*sqrt(2)
    r = 1 / math.sqrt(2)
    assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, -r, r], dtype=F64))
    loo = group_relative_advantages(RETURNS, GROUPS, normalize_std=True, eps=1e-12)
    # leave-one-out over the same std: task 7 [-1.5, 0, 1.5] / 1 ; task 9 [-4, 4] / (2*sqrt(2)) = -+sqrt(2)
    s = math.sqrt(2)
    assert_close(loo, torch.tensor([-1.5, 0.0, 1.5, 0.0, -s, s], dtype=F64))


def test_equal_returns_give_zero_not_nan():
    adv = group_relative_advantages(torch.full((3,), 4.0), torch.zeros(3, dtype=torch.long), normalize_std=True)
    assert torch.equal(adv, torch.zeros(3))


def test_matches_loop_reference_on_random_groups():
    g = torch.Generator().manual_seed(0)
    returns = torch.randn(40, generator=g, dtype=F64)
    groups = torch.randint(0, 9, (40,), generator=g)
    adv = group_relative_advantages(returns, groups)
    for i in range(40):
        others = [returns[j] for j in range(40) if j != i and groups[j] == groups[i]]
        expected = returns[i] - sum(others) / len(others) if others else 0.0
        assert_close(adv[i], torch.as_tensor(expected, dtype=F64))


def test_errors():
    with pytest.raises(TypeError, match="Expected group_ids to be an integer tensor"):
        group_relative_advantages(RETURNS, GROUPS.double())
    with pytest.raises(ValueError, match=r"Expected group_ids to have shape \(6,\) like returns"):
        group_relative_advantages(RETURNS, GROUPS[:5])
