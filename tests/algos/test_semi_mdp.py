"""Semi-MDP credit: option rewards and discounts (semi_mdp_rewards) and turn_gae with a per-turn gamma."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos import semi_mdp_rewards, turn_gae

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# One episode of 6 worker steps in 3 options lasting 2, 1 and 3 steps; gamma 0.9, lam 0.95.
STEPS = [1.0, 2.0, 0.5, 0.0, 1.0, 3.0]
DURATIONS = [2, 1, 3]
# R0 = 1 + 0.9*2 = 2.8 ; R1 = 0.5 ; R2 = 0 + 0.9*1 + 0.81*3 = 3.33
OPTION_REWARDS = [2.8, 0.5, 3.33]
# gamma ** d = 0.9**2, 0.9**1, 0.9**3
DISCOUNTS = [0.81, 0.9, 0.729]
V = [0.5, 1.0, 1.5]
NEXT = [1.0, 1.5, 2.0]  # V(s_1), V(s_2), then V of the state after the last option


def test_option_rewards_and_discounts_by_hand():
    rewards, discounts = semi_mdp_rewards(t(STEPS), DURATIONS, 0.9)
    assert rewards.dtype == F64 and discounts.dtype == F64
    assert_close(rewards, t(OPTION_REWARDS))
    assert_close(discounts, t(DISCOUNTS))


def test_options_of_one_step_are_the_step_rewards():
    rewards, discounts = semi_mdp_rewards([1.0, -2.0, 0.5], torch.tensor([1, 1, 1]), 0.7)
    assert_close(rewards, torch.tensor([1.0, -2.0, 0.5]))
    assert_close(discounts, torch.full((3,), 0.7))


def gae3(terminated: bool):
    adv, ret = turn_gae(t([OPTION_REWARDS]), t([V]), t([NEXT]), torch.tensor([[0, 0, int(terminated)]]),
                        torch.ones(1, 3), gamma=t([DISCOUNTS]), lam=0.95)
    return adv[0], ret[0]


def test_three_option_episode_terminated_by_hand():
    adv, ret = gae3(terminated=True)
    # delta2 = 3.33 + 0 (terminated) - 1.5 = 1.83
    # delta1 = 0.5 + 0.9*1.5 - 1.0 = 0.85
    # delta0 = 2.8 + 0.81*1.0 - 0.5 = 3.11
    # A2 = 1.83 ; A1 = 0.85 + (0.9*0.95)*1.83 = 2.41465 ; A0 = 3.11 + (0.81*0.95)*2.41465 = 4.968073175
    assert_close(adv, t([4.968073175, 2.41465, 1.83]))
    assert_close(ret, t([4.968073175 + 0.5, 2.41465 + 1.0, 1.83 + 1.5]))


def test_three_option_episode_truncated_bootstraps_by_gamma_to_the_duration():
    adv, _ = gae3(terminated=False)
    # delta2 = 3.33 + 0.729*2.0 - 1.5 = 3.288 ; A2 = 3.288
    # A1 = 0.85 + 0.855*3.288 = 3.66124 ; A0 = 3.11 + 0.7695*3.66124 = 5.92732418
    assert_close(adv, t([5.92732418, 3.66124, 3.288]))


def test_per_turn_gamma_equal_everywhere_matches_the_float():
    gen = torch.Generator().manual_seed(0)
    rewards, values, nxt = (torch.randn(3, 5, generator=gen) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    term = torch.tensor([[0, 0, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    lam = torch.tensor([0.95, 0.5, 1.0])
    want = turn_gae(rewards, values, nxt, term, mask, gamma=0.9, lam=lam)
    got = turn_gae(rewards, values, nxt, term, mask, gamma=torch.full((3, 5), 0.9), lam=lam)
    for w, g in zip(want, got):
        assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_per_turn_gamma_is_refused_with_a_wrong_shape_or_range():
    args = (t([[1.0, 2.0]]), t([[0.0, 0.0]]), t([[0.0, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"per-turn gamma of shape \(1, 2\).*got shape \(1, 3\)"):
        turn_gae(*args, gamma=torch.full((1, 3), 0.9), lam=0.9)
    with pytest.raises(ValueError, match=r"every per-turn gamma in \[0, 1\].*got 1.5 at \(episode, turn\) \(0, 1\)"):
        turn_gae(*args, gamma=t([[0.9, 1.5]]), lam=0.9)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        turn_gae(*args, gamma=t([[float("nan"), 0.9]]), lam=0.9)


def test_option_rewards_refuse_durations_that_do_not_cover_the_steps():
    with pytest.raises(ValueError, match=r"sum to the number of step rewards \(6\), got 5"):
        semi_mdp_rewards(t(STEPS), [2, 1, 2], 0.9)
    with pytest.raises(ValueError, match=r"every duration >= 1.*got 0 at option 1"):
        semi_mdp_rewards(t(STEPS), [3, 0, 3], 0.9)
    with pytest.raises(ValueError, match="integers"):
        semi_mdp_rewards(t(STEPS), [2.0, 1.0, 3.0], 0.9)
    with pytest.raises(ValueError, match=r"gamma in \[0, 1\]"):
        semi_mdp_rewards(t(STEPS), DURATIONS, 1.1)
    with pytest.raises(ValueError, match="1 dimensions"):
        semi_mdp_rewards(t([STEPS]), DURATIONS, 0.9)
