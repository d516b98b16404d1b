"""ppo_loss and a2c_loss: hand-computed values, masking, and the ratio == 1 special case."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos import a2c_loss, ppo_loss

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# Four action tokens and one masked token; ratios 1.5, 0.9, 0.5, 1.5 (old log-probs all 0).
RATIOS = [1.5, 0.9, 0.5, 1.5, 7.0]
ADV = [1.0, 1.0, -2.0, -2.0, 5.0]
MASK = [1, 1, 1, 1, 0]


def example():
    logprobs = t([[math.log(r) for r in RATIOS]]).requires_grad_()
    return logprobs, torch.zeros(1, 5, dtype=F64), t([ADV]), torch.tensor([MASK])


def test_hand_computed_clipped_surrogate_and_diagnostics():
    logprobs, old, adv, mask = example()
    out = ppo_loss(logprobs, old, adv, mask, clip_eps=0.2)
    # token 1: A=+1, r=1.5: max(-1.5, -1.2) = -1.2   (clipped)
    # token 2: A=+1, r=0.9: max(-0.9, -0.9) = -0.9   (inside the range)
    # token 3: A=-2, r=0.5: max( 1.0,  1.6) =  1.6   (clipped: 2*0.8)
    # token 4: A=-2, r=1.5: max( 3.0,  2.4) =  3.0   (outside the range but unclipped: pessimistic side)
    # policy_loss = (-1.2 - 0.9 + 1.6 + 3.0) / 4 = 0.625
    assert_close(out["policy_loss"], t(0.625))
    assert_close(out["loss"], t(0.625))
    assert_close(out["clipfrac"], t(0.5))  # tokens 1 and 3
    assert_close(out["ratio_mean"], t((1.5 + 0.9 + 0.5 + 1.5) / 4))
    k = lambda r: (r - 1) - math.log(r)  # noqa: E731
    assert_close(out["approx_kl"], t((k(1.5) + k(0.9) + k(0.5) + k(1.5)) / 4))
    assert set(out) == {"loss", "policy_loss", "approx_kl", "clipfrac", "ratio_mean"}
    out["loss"].backward()
    # d(-A r)/d log r = -A r on unclipped tokens, 0 on clipped ones; / 4 tokens
    assert_close(logprobs.grad, t([[0.0, -0.9 / 4, 0.0, 3.0 / 4, 0.0]]))
    for key in ("approx_kl", "clipfrac", "ratio_mean"):
        assert not out[key].requires_grad


def test_clip_eps_high_widens_the_upper_bound_only():
    logprobs, old, adv, mask = example()
    out = ppo_loss(logprobs, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    # token 1 is now clipped at 1.28: -1.28 ; the others as before
    assert_close(out["policy_loss"], t((-1.28 - 0.9 + 1.6 + 3.0) / 4))


def test_dual_clip_bounds_a_negative_advantage_token_whose_ratio_exploded():
    # Ratios 1.5, 0.9, 0.5, 60 (old log-probs 0): token 4 (A = -2) is a rare token the policy made 60x likelier.
    logprobs = t([[math.log(1.5), math.log(0.9), math.log(0.5), math.log(60.0), 0.0]]).requires_grad_()
    old, adv, mask = torch.zeros(1, 5, dtype=F64), t([ADV]), torch.tensor([MASK])
    plain = ppo_loss(logprobs, old, adv, mask, clip_eps=0.2)
    assert_close(plain["policy_loss"], t((-1.2 - 0.9 + 1.6 + 120.0) / 4))  # token 4 dominates
    out = ppo_loss(logprobs, old, adv, mask, clip_eps=0.2, dual_clip=3.0)
    assert_close(out["policy_loss"], t((-1.2 - 0.9 + 1.6 + 6.0) / 4))  # token 4 cut at -A * 3 = 6
    assert_close(out["dual_clipfrac"], t(0.25))
    out["loss"].backward()
    assert_close(logprobs.grad, t([[0.0, -0.9 / 4, 0.0, 0.0, 0.0]]))  # no gradient through the cut token
    # Below the dual-clip bound nothing changes: the example's token 4 has ratio 1.5.
    lp, old, adv, mask = example()
    assert_close(ppo_loss(lp, old, adv, mask, clip_eps=0.2, dual_clip=3.0)["policy_loss"], t(0.625))
    with pytest.raises(ValueError, match="dual_clip > 1 \\+ clip_eps_high"):
        ppo_loss(lp, old, adv, mask, clip_eps=0.2, dual_clip=1.1)


def test_entropy_bonus_and_reference_kl():
    logprobs, old, adv, mask = example()
    entropy = t([[1.0, 2.0, 3.0, 4.0, 100.0]])
    ref = logprobs.detach().clone()
    ref[0, 0] += math.log(2.0)  # the reference gives token 1 twice the probability
    out = ppo_loss(logprobs, old, adv, mask, entropy=entropy, ent_coef=0.1,
                   ref_logprobs=ref, kl_coef=0.5)
    # entropy mean over action tokens: (1+2+3+4)/4 = 2.5
    # k3 on token 1: 2 - 1 - ln 2 = 0.3068528 ; 0 on the others ; mean /4
    kl = (1 - math.log(2)) / 4
    assert_close(out["entropy"], t(2.5))
    assert_close(out["kl_ref"], t(kl))
    assert_close(out["loss"], t(0.625 - 0.1 * 2.5 + 0.5 * kl))


def test_masked_positions_change_neither_loss_nor_gradient():
    g = torch.Generator().manual_seed(0)
    shape = (3, 7)
    mask = torch.rand(shape, generator=g) < 0.5
    base = [torch.randn(shape, generator=g, dtype=F64) * 0.3 for _ in range(5)]

    def run(fill):
        lp, old, adv, ent, ref = (torch.where(mask, x, f) for x, f in zip(base, fill))
        lp = lp.clone().requires_grad_()
        out = ppo_loss(lp, old, adv, mask, entropy=ent, ent_coef=0.01, ref_logprobs=ref,
                       kl_coef=0.1, agg="seq_mean_token_mean")
        out["loss"].backward()
        return out, lp.grad

    out_a, grad_a = run([t(0.0)] * 5)
    out_b, grad_b = run([t(50.0), t(-math.inf), t(math.nan), t(math.nan), t(math.inf)])
    for key in out_a:
        assert_close(out_a[key], out_b[key])
    assert_close(grad_a, grad_b)
    assert torch.all(grad_a[~mask] == 0)


def test_ratio_one_gives_the_a2c_gradient():
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(4, 6, generator=g, dtype=F64)
    adv = torch.randn(4, 6, generator=g, dtype=F64)
    ent = torch.rand(4, 6, generator=g, dtype=F64)
    mask = torch.rand(4, 6, generator=g) < 0.6
    for agg in ("token_mean", "seq_mean_token_sum"):
        lp_ppo = lp.clone().requires_grad_()
        ppo_loss(lp_ppo, lp, adv, mask, entropy=ent, ent_coef=0.01, agg=agg)["loss"].backward()
        lp_a2c = lp.clone().requires_grad_()
        a2c_loss(lp_a2c, adv, mask, entropy=ent, ent_coef=0.01, agg=agg)["loss"].backward()
        assert_close(lp_ppo.grad, lp_a2c.grad)
        assert lp_ppo.grad.abs().sum() > 0


def test_a2c_hand_computed():
    logprobs = t([[-1.0, -2.0, -3.0]]).requires_grad_()
    out = a2c_loss(logprobs, t([[2.0, -1.0, 9.0]]), torch.tensor([[1, 1, 0]]))
    # -(2*-1 + -1*-2) / 2 = -(-2 + 2) / 2 = 0
    assert_close(out["loss"], t(0.0))
    out["loss"].backward()
    assert_close(logprobs.grad, t([[-1.0, 0.5, 0.0]]))  # -A / 2


def test_inputs_are_not_modified():
    logprobs, old, adv, mask = example()
    copies = [x.detach().clone() for x in (logprobs, old, adv, mask)]
    ppo_loss(logprobs, old, adv, mask)
    for x, c in zip((logprobs, old, adv, mask), copies):
        assert torch.equal(x.detach(), c)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ent_coef": 0.01}, "Expected an entropy tensor when ent_coef != 0"),
        ({"kl_coef": 0.1}, "Expected ref_logprobs when kl_coef != 0"),
        ({"clip_eps": 1.5}, r"Expected clip_eps in \(0, 1\), got 1.5"),
        ({"clip_eps_high": 0.0}, "Expected clip_eps_high > 0"),
        ({"agg": "mean"}, "Expected agg to be one of"),
    ],
)
def test_argument_errors(kwargs, message):
    logprobs, old, adv, mask = example()
    with pytest.raises(ValueError, match=message):
        ppo_loss(logprobs, old, adv, mask, **kwargs)


def test_shape_errors():
    logprobs, old, adv, mask = example()
    with pytest.raises(ValueError, match=r"Expected advantages to have shape \(1, 5\) like logprobs"):
        ppo_loss(logprobs, old, adv[:, :4], mask)
    with pytest.raises(ValueError, match=r"Expected mask to have shape \(1, 5\)"):
        ppo_loss(logprobs, old, adv, mask[:, :4])


def test_decoupled_ppo_clips_around_the_proximal_policy_and_weights_by_the_behaviour_ratio():
    logprobs, prox, adv, mask = example()  # ratios to the proximal policy as in the hand-computed example
    # Behaviour log-probs: tokens 1-2 sampled by this policy (w = 1), token 3 by one that gave it half the
    # probability (w = 2), token 4 by one that gave it a tenth (w = 10, past the cap of 5: left out).
    behaviour = t([[0.0, 0.0, math.log(0.5), math.log(0.1), 0.0]])
    out = ppo_loss(logprobs, prox, adv, mask, clip_eps=0.2, behaviour_logprobs=behaviour, behaviour_weight_cap=5.0)
    # per-token pg as plain PPO against the proximal policy (-1.2, -0.9, 1.6, 3.0), times w (1, 1, 2, 0), / 4
    assert_close(out["policy_loss"], t((-1.2 - 0.9 + 2 * 1.6 + 0.0) / 4))
    assert_close(out["behaviour_weight"], t((1 + 1 + 2 + 0) / 4))
    assert_close(out["behaviour_capped"], t(0.25))
    assert_close(out["clipfrac"], t(0.5))  # clipping is against the proximal policy, as before
    out["loss"].backward()
    assert_close(logprobs.grad, t([[0.0, -0.9 / 4, 0.0, 0.0, 0.0]]))  # token 4 left out, tokens 1, 3 clipped
    # No cap: token 4 counts with w = 10. Behaviour = proximal: exactly plain PPO.
    uncapped = ppo_loss(logprobs, prox, adv, mask, clip_eps=0.2, behaviour_logprobs=behaviour)
    assert_close(uncapped["policy_loss"], t((-1.2 - 0.9 + 2 * 1.6 + 10 * 3.0) / 4))
    same = ppo_loss(logprobs, prox, adv, mask, clip_eps=0.2, behaviour_logprobs=prox, behaviour_weight_cap=5.0)
    assert_close(same["loss"], ppo_loss(logprobs, prox, adv, mask, clip_eps=0.2)["loss"])
    with pytest.raises(ValueError, match="behaviour_weight_cap"):
        ppo_loss(logprobs, prox, adv, mask, behaviour_logprobs=behaviour, behaviour_weight_cap=0.0)
