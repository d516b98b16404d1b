"""Offline RL losses against hand computations: filtered BC's choice, the weighted NLL, IQL's expectile, V and Q
losses, CQL's losses and the sign and scale of its conservative penalty."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos.bc import bc_loss
from polyturn.algos.offline import (
    awr_weights,
    cql_losses,
    cql_penalty,
    expectile_loss,
    iql_losses,
    return_filter,
    weighted_nll,
)

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def test_return_filter_keeps_the_top_fraction_and_the_threshold():
    r = t([1.0, 5.0, 3.0, 5.0, -2.0])
    assert return_filter(r, top_fraction=0.2).tolist() == [False, True, False, True, False]  # ceil(1.0) = 1, tie kept
    assert return_filter(r, top_fraction=0.5).tolist() == [False, True, True, True, False]  # ceil(2.5) = 3
    assert return_filter(r, min_return=3.0).tolist() == [False, True, True, True, False]
    assert return_filter(r, top_fraction=0.5, min_return=4.0).tolist() == [False, True, False, True, False]
    assert return_filter(r).all()  # neither: plain BC
    with pytest.raises(ValueError, match="top_fraction in"):
        return_filter(r, top_fraction=0.0)


def test_weighted_nll_hand_computed():
    logprobs = t([[-1.0, -2.0, -3.0]]).requires_grad_()
    weights = t([[2.0, 0.5, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    out = weighted_nll(logprobs, weights, mask, correct=torch.tensor([[1, 0, 1]]))
    # (2 * 1 + 0.5 * 2) / 2 action tokens = 1.5; the unweighted NLL (1 + 2) / 2 = 1.5; weights' mean 1.25
    assert_close(out["loss"], t(1.5))
    assert_close(out["nll"], t(1.5))
    assert_close(out["weight_mean"], t(1.25))
    assert_close(out["token_accuracy"], t(0.5))
    out["loss"].backward()
    assert_close(logprobs.grad, t([[-1.0, -0.25, 0.0]]))  # -w / N on action tokens, 0 off them
    with pytest.raises(ValueError, match="non-negative"):
        weighted_nll(logprobs, t([[-1.0, 1.0, 1.0]]), mask)


def test_weighted_nll_with_unit_weights_is_bc():
    lp = t([[-0.5, -1.5, -0.2], [-3.0, -0.1, -9.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert_close(weighted_nll(lp, torch.ones_like(lp), mask)["loss"], bc_loss(lp, mask)["loss"])


def test_awr_weights_hand_computed():
    adv = t([[0.0, math.log(2.0), 10.0], [-math.log(4.0), 0.0, 0.0]])
    w = awr_weights(adv, torch.tensor([[1, 1, 1], [1, 0, 0]]), temperature=1.0, max_weight=20.0)
    assert_close(w, t([[1.0, 2.0, 20.0], [0.25, 0.0, 0.0]]))  # exp(A / T), capped at 20, 0 where masked


def test_expectile_loss_hand_computed():
    diff = t([2.0, -2.0, 1.0])
    # tau 0.9: (0.9 * 4 + 0.1 * 4 + 0.9 * 1) / 3
    assert_close(expectile_loss(diff, torch.ones(3), expectile=0.9), t(4.9 / 3))
    # tau 0.5 is half the mean squared error
    assert_close(expectile_loss(diff, torch.ones(3), expectile=0.5), t(0.5 * 9 / 3))
    assert_close(expectile_loss(diff, torch.tensor([1, 0, 0]), expectile=0.9), t(3.6))
    with pytest.raises(ValueError, match="expectile in"):
        expectile_loss(diff, torch.ones(3), expectile=1.0)


def test_iql_losses_hand_computed():
    v = t([1.0, 0.0]).requires_grad_()
    q = t([2.0, 1.0]).requires_grad_()
    q_target = t([3.0, -1.0]).requires_grad_()
    next_v = t([4.0, 100.0]).requires_grad_()
    out = iql_losses(v, q, q_target, next_v, t([0.5, 1.0]), torch.tensor([0, 1]), torch.ones(2), gamma=0.5,
                     expectile=0.7)
    # u = Q_target - V = [2, -1]: V loss (0.7 * 4 + 0.3 * 1) / 2 = 1.55
    assert_close(out["v_loss"], t(1.55))
    # y = [0.5 + 0.5 * 4, 1 + 0 (done)] = [2.5, 1]: Q loss 0.5 * ((2 - 2.5)^2 + 0) / 2 = 0.0625
    assert_close(out["q_loss"], t(0.0625))
    assert_close(out["loss"], t(1.6125))
    assert_close(out["adv_mean"], t(0.5))
    out["loss"].backward()
    assert_close(v.grad, t([-1.4, 0.3]))  # -2 w u / N
    assert_close(q.grad, t([-0.25, 0.0]))  # (Q - y) / N
    assert q_target.grad is None and next_v.grad is None  # targets are constants


def test_cql_losses_hand_computed():
    q_data = t([1.0, 0.0]).requires_grad_()
    q_sampled = t([[0.0, 0.0], [2.0, 0.0]]).requires_grad_()
    v = t([0.0, 0.0]).requires_grad_()
    out = cql_losses(q_data, q_sampled, v, t([1.0, 1.0]), torch.ones(2), alpha=0.5)
    assert_close(out["td_loss"], t(0.25))  # 0.5 * (0 + 1) / 2
    row0 = math.log(math.e + 2.0) - 1.0  # logsumexp(1, 0, 0) - 1
    row1 = math.log(2.0 + math.e**2)  # logsumexp(0, 2, 0) - 0
    assert_close(out["penalty"], t((row0 + row1) / 2))
    assert_close(out["v_loss"], t(0.25))  # V's target: the sampled actions' mean Q [0, 1]
    assert_close(out["loss"], t(0.25 + 0.25 + 0.5 * (row0 + row1) / 2))
    assert_close(out["gap"], t(0.0))  # (1 - 0 + 0 - 1) / 2
    # a candidate missing from row 1 (masked): its logsumexp runs over the data action and the one left
    masked = cql_losses(q_data, q_sampled, v, t([1.0, 1.0]), torch.ones(2), alpha=0.5,
                        sampled_mask=torch.tensor([[1, 1], [1, 0]]))
    assert_close(masked["penalty"], t((row0 + math.log(1.0 + math.e**2)) / 2))


def test_cql_penalty_pushes_out_of_data_actions_down_relative_to_the_data_action():
    q_data = t([0.5, -1.0]).requires_grad_()
    q_sampled = t([[0.3, 1.2, -0.4], [0.0, 0.0, 2.0]]).requires_grad_()
    out = cql_losses(q_data, q_sampled, t([0.0, 0.0]), q_data.detach(), torch.ones(2), alpha=1.0)
    assert out["penalty"] >= 0  # the data action is a candidate: logsumexp >= its Q
    out["penalty"].backward()
    assert (q_sampled.grad > 0).all()  # descent lowers Q of every sampled action ...
    assert (q_data.grad < 0).all()  # ... and raises Q of the data action
    # A few steps on the penalty alone widen the gap between the data action and the others.
    qd, qs = q_data.detach().clone().requires_grad_(), q_sampled.detach().clone().requires_grad_()
    before = float((qd.mean() - qs.mean()).detach())
    opt = torch.optim.SGD([qd, qs], lr=0.5)
    for _ in range(20):
        opt.zero_grad()
        cql_losses(qd, qs, t([0.0, 0.0]), t([0.0, 0.0]), torch.ones(2), alpha=1.0)["penalty"].backward()
        opt.step()
    assert float((qd.mean() - qs.mean()).detach()) > before + 1.0


def test_cql_penalty_scale_and_alpha_zero():
    # K sampled actions with the data action's Q: logsumexp over K + 1 equal values is log(K + 1) above it.
    for k in (1, 3, 7):
        out = cql_losses(t([2.0]), t([[2.0] * k]), t([0.0]), t([2.0]), torch.ones(1), alpha=1.0)
        assert_close(out["penalty"], t(math.log(k + 1)))
    # Out-of-data actions far below the data action: the penalty goes to 0.
    assert float(cql_losses(t([0.0]), t([[-30.0, -30.0]]), t([0.0]), t([0.0]), torch.ones(1), alpha=1.0)["penalty"]) < 1e-12
    # alpha = 0: the loss is the TD and V losses alone, and no gradient reaches the sampled actions' Q.
    q_sampled = t([[1.0, 5.0]]).requires_grad_()
    out = cql_losses(t([0.0]), q_sampled, t([3.0]), t([1.0]), torch.ones(1), alpha=0.0)
    assert_close(out["loss"], out["td_loss"] + out["v_loss"])
    out["loss"].backward()
    assert q_sampled.grad is None or torch.all(q_sampled.grad == 0)
    # The penalty is algos.value.cql_penalty over the data action and the sampled ones.
    qs = t([[0.3, -2.0], [1.0, 4.0]])
    assert_close(cql_losses(t([0.1, 0.2]), qs, t([0.0, 0.0]), t([0.0, 0.0]), torch.ones(2), alpha=1.0)["penalty"],
                 cql_penalty(torch.cat([t([[0.1], [0.2]]), qs], 1), t([0.1, 0.2]), torch.ones(2)))
    with pytest.raises(ValueError, match="alpha >= 0"):
        cql_losses(t([0.0]), q_sampled, t([3.0]), t([1.0]), torch.ones(1), alpha=-1.0)
