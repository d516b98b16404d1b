"""Critic losses and targets: value_loss, explained_variance, td_targets, polyak_update, cql_penalty."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from polyturn.algos import cql_penalty, explained_variance, polyak_update, td_targets, value_loss

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def test_value_loss_is_half_masked_mse():
    values = t([1.0, 2.0, 3.0]).requires_grad_()
    out = value_loss(values, t([2.0, 2.0, 50.0]), torch.tensor([1, 1, 0]))
    # 0.5 * ((1-2)^2 + (2-2)^2) / 2 = 0.25
    assert_close(out["loss"], t(0.25))
    out["loss"].backward()
    assert_close(values.grad, t([-0.5, 0.0, 0.0]))  # (v - R) / 2
    assert "clipfrac" not in out


def test_value_clipping():
    values = t([1.0, 2.05, 3.0]).requires_grad_()
    returns = t([2.0, 2.0, 0.0])
    old = t([0.0, 2.1, 0.0])
    out = value_loss(values, returns, torch.tensor([1, 1, 0]), old_values=old, clip_range=0.2)
    # entry 0: moved 1.0 from old 0 -> clipped to 0.2: max((1-2)^2, (0.2-2)^2) = 3.24 (clipped side)
    # entry 1: moved -0.05, inside the range: (2.05-2)^2 = 0.0025
    # loss = 0.5 * (3.24 + 0.0025) / 2 = 0.810625
    assert_close(out["loss"], t(0.810625))
    assert_close(out["clipfrac"], t(0.5))
    out["loss"].backward()
    # entry 0 is on the clipped branch: no gradient; entry 1: 0.5 * 2 * 0.05 / 2 = 0.025
    assert_close(values.grad, t([0.0, 0.025, 0.0]))


def test_value_loss_does_not_backprop_into_returns():
    returns = t([1.0, 2.0]).requires_grad_()
    values = t([0.0, 0.0]).requires_grad_()
    value_loss(values, returns, torch.ones(2))["loss"].backward()
    assert returns.grad is None and values.grad is not None


def test_value_loss_needs_old_values_and_clip_range_together():
    with pytest.raises(ValueError, match="Expected old_values and clip_range together"):
        value_loss(t([1.0]), t([1.0]), torch.ones(1), clip_range=0.2)


def test_explained_variance():
    target = t([1.0, 2.0, 3.0, 99.0])
    mask = torch.tensor([1, 1, 1, 0])
    assert_close(explained_variance(target, target, mask), t(1.0))
    assert_close(explained_variance(t([2.0, 2.0, 2.0, 0.0]), target, mask), t(0.0))
    # residual [0, 0, 1]: var = 1/3 - 1/9 = 2/9 ; var(target) = 2/3 ; 1 - (2/9)/(2/3) = 2/3
    assert_close(explained_variance(t([1.0, 2.0, 2.0, 0.0]), target, mask), t(2 / 3))
    assert math.isnan(explained_variance(t([1.0, 2.0]), t([5.0, 5.0]), torch.ones(2)).item())


def test_explained_variance_of_nearly_constant_targets_is_nan():
    # sd 0.01 around -5 (Var 1e-4 < 1e-4 x 25): a critic 0.1 off would score about -100; that measures nothing.
    target = torch.tensor([-4.99, -5.01, -4.99, -5.01], dtype=torch.float64)
    pred = target + torch.tensor([0.1, -0.1, -0.1, 0.1], dtype=torch.float64)
    assert math.isnan(explained_variance(pred, target, torch.ones(4)).item())
    spread = target * 10 - torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)  # sd 0.5 around -50.5: fine
    assert math.isfinite(explained_variance(spread + 0.1, spread, torch.ones(4)).item())
    assert math.isnan(explained_variance(t([0.0, 0.0]), t([1e-5, -1e-5]), torch.ones(2)).item())  # all about 0


def test_td_targets_bootstrap_unless_terminated():
    next_values = t([10.0, 20.0, 30.0]).requires_grad_()
    out = td_targets(t([1.0, 2.0, 3.0]), next_values, torch.tensor([0, 1, 0]), gamma=0.9)
    # [1 + 0.9*10, 2 (terminated), 3 + 0.9*30]
    assert_close(out, t([10.0, 2.0, 30.0]))
    assert not out.requires_grad


def test_td_targets_per_row_gamma():
    out = td_targets(t([[1.0, 1.0], [1.0, 1.0]]), t([[2.0, 2.0], [2.0, 2.0]]), torch.zeros(2, 2),
                     gamma=t([0.0, 0.5]))
    assert_close(out, t([[1.0, 1.0], [2.0, 2.0]]))


def make_pair():
    torch.manual_seed(0)
    target = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    source = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    with torch.no_grad():
        source[1].running_mean.fill_(2.0)
        source[1].num_batches_tracked.fill_(7)
    return target, source


def snapshot(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_polyak_tau_zero_keeps_target():
    target, source = make_pair()
    before = snapshot(target)
    polyak_update(target, source, 0.0)
    for k, v in snapshot(target).items():
        if k != "1.num_batches_tracked":
            assert torch.equal(v, before[k]), k


def test_polyak_tau_one_copies_source():
    target, source = make_pair()
    polyak_update(target, source, 1.0)
    for k, v in snapshot(target).items():
        assert torch.equal(v, source.state_dict()[k]), k


def test_polyak_half_averages_and_leaves_source_alone():
    target, source = make_pair()
    t0, s0 = snapshot(target), snapshot(source)
    polyak_update(target, source, 0.5)
    assert_close(target[0].weight.detach(), (t0["0.weight"] + s0["0.weight"]) / 2)
    assert_close(target[1].running_mean, (t0["1.running_mean"] + 2.0) / 2)
    assert int(target[1].num_batches_tracked) == 7
    for k, v in snapshot(source).items():
        assert torch.equal(v, s0[k])
    assert target[0].weight.requires_grad and target[0].weight.grad_fn is None


def test_polyak_rejects_mismatched_modules():
    with pytest.raises(ValueError, match="Expected source 0.weight of shape"):
        polyak_update(nn.Sequential(nn.Linear(3, 4)), nn.Sequential(nn.Linear(3, 5)), 0.5)
    with pytest.raises(ValueError, match=r"Expected tau in \[0, 1\]"):
        polyak_update(nn.Linear(1, 1), nn.Linear(1, 1), 2.0)


def test_cql_penalty_hand_computed():
    q = t([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]).requires_grad_()
    q_data = t([3.0, 0.0])
    # row 0: logsumexp(1,2,3) - 3 = log(1 + e^-1 + e^-2) = 0.4076059 ; row 1: log 3 - 0 = 1.0986123
    row0, row1 = math.log(1 + math.exp(-1) + math.exp(-2)), math.log(3)
    assert_close(cql_penalty(q, q_data, torch.ones(2)), t((row0 + row1) / 2))
    # two candidates in row 1: log 2
    cm = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert_close(cql_penalty(q, q_data, torch.ones(2), candidate_mask=cm), t((row0 + math.log(2)) / 2))
    # only row 0 counts; row 1 has no candidate but is masked out, and its gradient is 0, not NaN
    out = cql_penalty(q, q_data, torch.tensor([1, 0]), candidate_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))
    assert_close(out, t(row0))
    out.backward()
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[1] == 0)
    with pytest.raises(ValueError, match="Expected at least one candidate in every counted row"):
        cql_penalty(q, q_data, torch.ones(2), candidate_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))
