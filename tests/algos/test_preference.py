"""Bradley-Terry, turn-level DPO and AWR weights against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from polyturn.algos.preference import (awr_weights, bradley_terry_loss, dpo_loss, episode_scores,
                                      redistributed_advantages)


def _nls(x: float) -> float:
    """-log sigmoid(x), by hand."""
    return math.log(1.0 + math.exp(-x))


def test_bradley_terry_loss_matches_a_hand_computation():
    better, worse = torch.tensor([1.0, 0.5, -2.0]), torch.tensor([0.0, 1.5, -1.0])
    out = bradley_terry_loss(better, worse, beta=2.0)
    # margins 2 * (1, -1, -1) = (2, -2, -2): one pair ranked right
    want = (_nls(2.0) + _nls(-2.0) + _nls(-2.0)) / 3
    assert out["loss"].item() == pytest.approx(want, rel=1e-6)
    assert out["accuracy"].item() == pytest.approx(1 / 3)
    w = bradley_terry_loss(better, worse, beta=2.0, weights=torch.tensor([1.0, 0.0, 3.0]))
    assert w["loss"].item() == pytest.approx((_nls(2.0) + 3 * _nls(-2.0)) / 4, rel=1e-6)


def test_bradley_terry_gradient_pushes_the_better_score_up():
    better = torch.tensor([0.0], requires_grad=True)
    worse = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(better, worse, beta=1.0)["loss"].backward()
    assert better.grad.item() == pytest.approx(-0.5) and worse.grad.item() == pytest.approx(0.5)


def test_episode_scores_sum_turns_with_optional_length_normalisation():
    s = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert episode_scores(s, mask).tolist() == [3.0, 4.0]
    lengths = torch.tensor([[2.0, 4.0, 1.0], [8.0, 1.0, 1.0]])
    assert episode_scores(s, mask, lengths=lengths).tolist() == [1.0, 0.5]


def test_dpo_loss_matches_a_hand_computation():
    c, r = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -3.0]), torch.tensor([-1.5, -2.0])
    out = dpo_loss(c, r, rc, rr, beta=0.5)
    # margins 0.5 * ((0.5) - (-0.5)) = 0.5 and 0.5 * (0 - 1) = -0.5
    assert out["loss"].item() == pytest.approx((_nls(0.5) + _nls(-0.5)) / 2, rel=1e-6)
    assert out["accuracy"].item() == 0.5 and out["reward_margin"].item() == pytest.approx(0.0, abs=1e-7)


def test_awr_weights_are_capped_exponentials_and_zero_off_mask():
    adv = torch.tensor([[0.0, math.log(3.0), 10.0]])
    w = awr_weights(adv, torch.tensor([[1, 1, 0]]), temperature=1.0, max_weight=2.5)
    assert w[0].tolist() == pytest.approx([1.0, 2.5, 0.0])


def test_redistributed_advantages_keep_the_episode_total_and_follow_the_scores():
    adv = torch.tensor([2.0, -1.0, 0.5])
    scores = torch.tensor([[0.0, math.log(3.0), 9.0], [0.0, math.log(3.0), 9.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1]])
    out = redistributed_advantages(adv, scores, mask, temperature=1.0)
    # success: shares 1/4, 3/4 of 2 turns x 2; failure: the blame goes to the lower score, 3/4 and 1/4 of 2 x -1
    assert out[0].tolist() == pytest.approx([1.0, 3.0, 0.0])
    assert out[1].tolist() == pytest.approx([-1.5, -0.5, 0.0])
    assert out[2].tolist() == pytest.approx([0.5, 0.5, 0.5])  # equal scores: every turn shares A, as with no critic
    assert out.sum(1).tolist() == pytest.approx((adv * mask.sum(1)).tolist())
    hot = redistributed_advantages(adv, scores, mask, temperature=1e6)
    assert hot[0].tolist() == pytest.approx([2.0, 2.0, 0.0], rel=1e-4)  # large temperature: the critic-free baseline
    with pytest.raises(ValueError, match="expected \\(3,\\)"):
        redistributed_advantages(adv[:2], scores, mask)


def test_preference_losses_reject_bad_arguments():
    with pytest.raises(ValueError, match="Expected at least one pair"):
        bradley_terry_loss(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="shape"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="beta > 0"):
        dpo_loss(*(torch.zeros(1),) * 4, beta=0.0)
