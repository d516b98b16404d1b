"""turn_gae against hand-computed values, per-episode computation and a loop reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from polyturn.algos import next_state_values, normalize, token_advantages, turn_gae

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# One 3-turn episode used by several cases.
R = [1.0, 0.0, 2.0]
V = [0.5, 1.0, 1.5]
NEXT = [1.0, 1.5, 2.0]  # V of the state after each turn: V[1], V[2], then V(final state) = 2.0


def gae1(gamma, lam, terminated: bool):
    term = [0, 0, 1] if terminated else [0, 0, 0]
    adv, ret = turn_gae(
        t([R]), t([V]), t([NEXT]), torch.tensor([term]), torch.ones(1, 3), gamma=gamma, lam=lam
    )
    return adv[0], ret[0]


def test_terminated_episode_does_not_bootstrap():
    adv, ret = gae1(0.9, 0.8, terminated=True)
    # delta0 = 1 + 0.9*1.0 - 0.5 = 1.4 ; delta1 = 0 + 0.9*1.5 - 1.0 = 0.35
    # delta2 = 2 + 0 (terminated: next value 2.0 dropped) - 1.5 = 0.5
    # A2 = 0.5 ; A1 = 0.35 + 0.72*0.5 = 0.71 ; A0 = 1.4 + 0.72*0.71 = 1.9112
    assert_close(adv, t([1.9112, 0.71, 0.5]))
    assert_close(ret, t([1.9112 + 0.5, 0.71 + 1.0, 0.5 + 1.5]))


def test_truncated_episode_bootstraps_from_next_value():
    adv, ret = gae1(0.9, 0.8, terminated=False)
    # delta2 = 2 + 0.9*2.0 - 1.5 = 2.3 ; A2 = 2.3
    # A1 = 0.35 + 0.72*2.3 = 2.006 ; A0 = 1.4 + 0.72*2.006 = 2.84432
    assert_close(adv, t([2.84432, 2.006, 2.3]))
    assert_close(ret, t([3.34432, 3.006, 3.8]))


def test_gamma_zero_is_reward_minus_value():
    adv, _ = gae1(0.0, 0.8, terminated=False)
    # delta_t = r_t - V_t and nothing propagates: [1-0.5, 0-1, 2-1.5]
    assert_close(adv, t([0.5, -1.0, 0.5]))


def test_lam_zero_is_one_step_td_error():
    adv, _ = gae1(0.9, 0.0, terminated=True)
    assert_close(adv, t([1.4, 0.35, 0.5]))


def test_lam_one_is_discounted_monte_carlo_return_minus_value():
    adv, ret = gae1(0.9, 1.0, terminated=True)
    # G2 = 2 ; G1 = 0 + 0.9*2 = 1.8 ; G0 = 1 + 0.9*1.8 = 2.62
    assert_close(ret, t([2.62, 1.8, 2.0]))
    assert_close(adv, t([2.62 - 0.5, 1.8 - 1.0, 2.0 - 1.5]))
    # Truncated: the MC return is bootstrapped from V(final) = 2.0: G2 = 2 + 0.9*2 = 3.8
    _, ret = gae1(0.9, 1.0, terminated=False)
    assert_close(ret, t([1 + 0.9 * (0 + 0.9 * 3.8), 0 + 0.9 * 3.8, 3.8]))


def test_gamma_one():
    adv, _ = gae1(1.0, 0.5, terminated=False)
    # delta = [1 + 1.0 - 0.5, 0 + 1.5 - 1.0, 2 + 2.0 - 1.5] = [1.5, 0.5, 2.5]
    # A2 = 2.5 ; A1 = 0.5 + 0.5*2.5 = 1.75 ; A0 = 1.5 + 0.5*1.75 = 2.375
    assert_close(adv, t([2.375, 1.75, 2.5]))


def test_padding_gives_zero_and_ignores_garbage():
    nan = math.nan
    rewards = t([R, [1.0, 1.0, nan]])
    values = t([V, [2.0, 3.0, nan]])
    next_values = t([[1.0, 1.5, nan], [3.0, 4.0, nan]])  # NaN after a terminal turn is ignored too
    terminated = torch.tensor([[False, False, True], [False, False, False]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = turn_gae(rewards, values, next_values, terminated, mask, gamma=0.9, lam=0.8)
    assert_close(adv[0], t([1.9112, 0.71, 0.5]))
    # row 1, truncated after 2 turns: delta0 = 1 + 0.9*3 - 2 = 1.7 ; delta1 = 1 + 0.9*4 - 3 = 1.6
    # A1 = 1.6 ; A0 = 1.7 + 0.72*1.6 = 2.852 ; padded turn -> 0
    assert_close(adv[1], t([2.852, 1.6, 0.0]))
    assert_close(ret[1], t([4.852, 4.6, 0.0]))


def test_empty_episode_row_is_all_zero():
    adv, ret = turn_gae(
        t([[5.0, 5.0]]), t([[1.0, 1.0]]), t([[1.0, 1.0]]), torch.zeros(1, 2), torch.zeros(1, 2),
        gamma=0.9, lam=0.9,
    )
    assert_close(adv, torch.zeros(1, 2, dtype=F64))
    assert_close(ret, torch.zeros(1, 2, dtype=F64))


def test_batch_of_different_lengths_equals_per_episode():
    g = torch.Generator().manual_seed(0)
    lengths, T = [4, 1, 3, 0], 4
    E = len(lengths)
    rewards, values, next_values = (torch.randn(E, T, generator=g, dtype=F64) for _ in range(3))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    terminated = torch.zeros(E, T, dtype=torch.bool)
    terminated[0, 3] = True
    terminated[2, 2] = True
    adv, ret = turn_gae(rewards, values, next_values, terminated, mask, gamma=0.95, lam=0.9)
    for e, n in enumerate(lengths):
        sl = slice(e, e + 1), slice(0, n)
        a1, r1 = turn_gae(
            rewards[sl], values[sl], next_values[sl], terminated[sl], mask[sl], gamma=0.95, lam=0.9
        )
        assert_close(adv[e, :n], a1[0])
        assert_close(ret[e, :n], r1[0])
        assert torch.all(adv[e, n:] == 0) and torch.all(ret[e, n:] == 0)


def test_per_episode_gamma_and_lambda_tensors():
    rewards, values, next_values = t([R, R]), t([V, V]), t([NEXT, NEXT])
    term = torch.zeros(2, 3)
    adv, _ = turn_gae(rewards, values, next_values, term, torch.ones(2, 3),
                      gamma=t([0.0, 1.0]), lam=t([0.8, 0.5]))
    assert_close(adv[0], t([0.5, -1.0, 0.5]))  # as test_gamma_zero
    assert_close(adv[1], t([2.375, 1.75, 2.5]))  # as test_gamma_one


def reference_gae(rewards, values, next_values, lengths, terminated, gammas, lams):
    """Per-episode python loop, the textbook recursion, V(s_{t+1}) from next_values."""
    out = []
    for e, n in enumerate(lengths):
        adv = [0.0] * len(rewards[e])
        running = 0.0
        for k in reversed(range(n)):
            done = terminated[e] and k == n - 1
            boot = 0.0 if done else gammas[e] * next_values[e][k]
            delta = rewards[e][k] + boot - values[e][k]
            running = delta + gammas[e] * lams[e] * running
            adv[k] = running
        out.append(adv)
    return out


@st.composite
def padded_batches(draw):
    E = draw(st.integers(1, 4))
    T = draw(st.integers(1, 6))
    num = st.floats(-10, 10, allow_nan=False)
    grid = lambda: [[draw(num) for _ in range(T)] for _ in range(E)]  # noqa: E731
    lengths = [draw(st.integers(0, T)) for _ in range(E)]
    terminated = [draw(st.booleans()) and n > 0 for n in lengths]
    unit = st.floats(0, 1)
    per_row = draw(st.booleans())
    gammas = [draw(unit) for _ in range(E)] if per_row else [draw(unit)] * E
    lams = [draw(unit) for _ in range(E)] if per_row else [draw(unit)] * E
    return grid(), grid(), grid(), lengths, terminated, gammas, lams, per_row


@settings(max_examples=60, deadline=None)
@given(padded_batches())
def test_matches_python_loop_reference(batch):
    rewards, values, next_values, lengths, terminated, gammas, lams, per_row = batch
    E, T = len(rewards), len(rewards[0])
    mask = torch.tensor([[k < n for k in range(T)] for n in lengths])
    term = torch.tensor([[d and k == n - 1 for k in range(T)] for n, d in zip(lengths, terminated)])
    gamma = t(gammas) if per_row else gammas[0]
    lam = t(lams) if per_row else lams[0]
    adv, ret = turn_gae(t(rewards), t(values), t(next_values), term, mask, gamma=gamma, lam=lam)
    expected = t(reference_gae(rewards, values, next_values, lengths, terminated, gammas, lams))
    assert_close(adv, expected)
    assert_close(ret, torch.where(mask, expected + t(values), 0.0))


def test_next_state_values_shifts_and_fills_final():
    values = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = next_state_values(values, mask, t([7.0, 8.0]))
    assert_close(out, t([[2.0, 3.0, 7.0], [5.0, 8.0, 0.0]]))


def test_next_state_values_feeds_turn_gae_like_values_shifted_by_one():
    # Same truncated episode as above: V(s_{t+1}) = V[t+1], V(final) = 2.0.
    nv = next_state_values(t([V]), torch.ones(1, 3), t([2.0]))
    adv, _ = turn_gae(t([R]), t([V]), nv, torch.zeros(1, 3), torch.ones(1, 3), gamma=0.9, lam=0.8)
    assert_close(adv[0], t([2.84432, 2.006, 2.3]))


def test_token_advantages_broadcasts_turns_to_their_tokens():
    turn_adv = t([[1.0, 2.0], [3.0, 4.0]])
    turn_index = torch.tensor([[-1, 0, 0, -1, 1, 1], [-1, -1, 1, -1, -1, -1]])
    out = token_advantages(turn_adv, turn_index)
    assert_close(out, t([[0, 1, 1, 0, 2, 2], [0, 0, 4, 0, 0, 0]]))


def test_token_advantages_rejects_bad_index():
    with pytest.raises(ValueError, match=r"Expected turn_index in \[-1, 1\]"):
        token_advantages(t([[1.0, 2.0]]), torch.tensor([[0, 2]]))
    with pytest.raises(TypeError, match="Expected turn_index to be an integer tensor"):
        token_advantages(t([[1.0, 2.0]]), t([[0.0, 1.0]]))


def test_normalize_uses_masked_entries_only():
    x = t([1.0, 2.0, 3.0, 100.0])
    out = normalize(x, torch.tensor([1, 1, 1, 0]))
    # mean 2, population std sqrt((1 + 0 + 1) / 3) = sqrt(2/3)
    s = math.sqrt(2 / 3)
    assert_close(out, t([-1 / s, 0.0, 1 / s, 0.0]))
    assert_close(normalize(t([5.0, 5.0]), torch.ones(2)), t([0.0, 0.0]))


def test_inputs_are_not_modified():
    args = [t([R]), t([V]), t([NEXT]), torch.tensor([[0, 0, 1]]), torch.ones(1, 3)]
    copies = [a.clone() for a in args]
    turn_gae(*args, gamma=0.9, lam=0.8)
    for a, c in zip(args, copies):
        assert torch.equal(a, c)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"values": torch.zeros(1, 4, dtype=F64)}, ValueError, r"Expected values to have shape \(1, 3\)"),
        ({"rewards": torch.zeros(1, 3, dtype=torch.long)}, TypeError, "Expected rewards to be a floating"),
        ({"values": torch.zeros(1, 3, dtype=torch.float32)}, TypeError, "Expected values to have dtype"),
        ({"mask": torch.tensor([[1, 0, 1]])}, ValueError, "Expected mask to hold each episode's real turns first"),
        ({"mask": torch.tensor([[1, 2, 1]])}, ValueError, "Expected mask to hold only 0 and 1"),
        ({"terminated": torch.tensor([[1, 0, 0]])}, ValueError, "Expected terminated to be 1 only on the last"),
        ({"gamma": 1.5}, ValueError, r"Expected gamma in \[0, 1\], got 1.5"),
        ({"lam": t([0.5, 0.5])}, ValueError, r"Expected lam to be a float or a tensor of shape \(1,\)"),
    ],
)
def test_validation_errors(change, error, message):
    kwargs = dict(rewards=t([R]), values=t([V]), next_values=t([NEXT]),
                  terminated=torch.zeros(1, 3), mask=torch.ones(1, 3), gamma=0.9, lam=0.8)
    kwargs.update(change)
    with pytest.raises(error, match=message):
        turn_gae(**kwargs)


def test_normalize_with_token_weights():
    # Two turns: advantage 1 on a 3-token turn, -1 on a 1-token turn.
    x = torch.tensor([[1.0, -1.0, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    w = torch.tensor([[3.0, 1.0, 5.0]])
    out = normalize(x, mask, weights=w)
    # weighted mean = (3*1 - 1)/4 = 0.5; weighted var = (3*0.25 + 2.25)/4 = 0.75
    std = 0.75 ** 0.5
    assert torch.allclose(out, torch.tensor([[0.5 / std, -1.5 / std, 0.0]]), atol=1e-6)
    tokens = torch.tensor([out[0, 0]] * 3 + [out[0, 1]])
    assert abs(float(tokens.mean())) < 1e-6  # token-level mean push is zero
    assert torch.allclose(normalize(x, mask, weights=torch.ones_like(x)), normalize(x, mask))
