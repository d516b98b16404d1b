"""Micro-batched updates: the whole minibatch's gradient and statistics, with less padding."""

from __future__ import annotations

import copy
import itertools
import random

import numpy as np
import pytest
import torch

from polyturn.train.batch import MicroStats, length_batches, micro_batches, padded_tokens
from polyturn.train.critics import encoded_rows, state_input
from polyturn.train.trainer import Trainer

SMALL = 160  # tokens per micro-batch: several micro-batches per minibatch of the tiny test episodes


def _collect(tr: Trainer, n: int = 8) -> list:
    """``n`` sampled episodes whose recorded log-probs are perturbed, so PPO's ratio moves off 1 and clips."""
    tasks = [{"seed": 500 + k, "options": {}} for k in range(n)]
    eps = tr.collector.collect(tasks, temperature=1.0, rng=np.random.default_rng(0),
                               generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    for ep in eps:
        for seg in ep.segments:
            noise = (0.5 * torch.randn(len(seg), generator=g)).tolist()
            seg.logprobs = [lp + z if m else lp for lp, z, m in zip(seg.logprobs, noise, seg.action_mask)]
    return eps


@pytest.fixture(scope="module", params=["ppo", "a2c"])
def setup(request, tmp_path_factory, make_cfg):
    """A trainer with the shared critic (its value loss joins the actor's step), sampled episodes and targets."""
    algo = ["ppo.kl_coef=0.1"] if request.param == "ppo" else ["ppo.algo=a2c"]
    tr = Trainer(make_cfg(tmp_path_factory.mktemp(request.param), "critic.kind=shared", "critic.value_clip=0.2",
                          "ppo.epochs=1", "ppo.minibatch_episodes=8", *algo))
    tr.policy.set_reference()
    if tr.policy.ref_actor is not None:  # a reference apart from the policy: the KL term has a gradient
        with torch.no_grad():
            for p in tr.policy.ref_actor.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    eps = _collect(tr)
    t = max(len(ep.turns) for ep in eps)
    g = torch.Generator().manual_seed(3)
    targets = [torch.randn(len(eps), t, generator=g) for _ in range(3)]  # advantages, returns, old values
    return tr, eps, targets


def _accumulate(tr: Trainer, eps, targets, budget: int | None) -> tuple[list[torch.Tensor], MicroStats, int]:
    """Backward of the RL (+ shared critic) and BC parts of one minibatch, as update_actor runs them."""
    tr.cfg.actor.microbatch_tokens = budget
    tr.actor.train_without_dropout()
    params = tr.actor.trainable_parameters() + tr.critic.joint_parameters()
    for p in params:
        p.grad = None
    acc = MicroStats()
    parts = itertools.chain(tr.policy._rl_losses(tr.algo, eps, *targets, acc, temperature=0.9, ent_coef=0.01, weight=0.7),
                            tr.policy.bc_loss(range(8), acc, weight=0.3))
    n = 0
    for part in parts:
        part.backward()
        n += 1
    return [p.grad.clone() for p in params], acc, n


def test_accumulated_micro_batches_give_the_minibatch_gradient_and_stats(setup):
    tr, eps, targets = setup
    whole, acc_whole, n_whole = _accumulate(tr, eps, targets, None)
    micro, acc_micro, n_micro = _accumulate(tr, eps, targets, SMALL)
    assert n_whole == 2 and n_micro > 4  # one RL and one BC part, against several micro-batches of each
    assert all(g.abs().max() > 0 for g in whole[-2:])  # the value head is trained by this step
    for a, b in zip(whole, micro):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    s_whole, s_micro = acc_whole.result(), acc_micro.result()
    assert set(s_whole) == set(s_micro) and "losses/value_loss" in s_whole and "losses/bc_loss" in s_whole
    if tr.cfg.ppo.algo == "ppo":
        assert {"losses/approx_kl", "losses/kl_ref"} <= set(s_whole) and s_whole["losses/clipfrac"] > 0
    for k, v in s_whole.items():
        assert s_micro[k] == pytest.approx(v, abs=1e-6), k
    assert acc_micro.padding < acc_whole.padding


def test_update_actor_reports_the_same_with_and_without_micro_batches(setup):
    tr, eps, targets = setup
    snapshot = (copy.deepcopy(tr.actor.model.state_dict()), copy.deepcopy(tr.critic.head.state_dict()),
                tr.py_rng.getstate(), copy.deepcopy(tr.state.actor_steps))
    out = {}
    for budget in (None, SMALL):
        tr.actor.model.load_state_dict(snapshot[0])
        tr.critic.head.load_state_dict(snapshot[1])
        tr.py_rng.setstate(snapshot[2])
        tr.state.actor_steps = copy.deepcopy(snapshot[3])
        tr.cfg.actor.microbatch_tokens = budget
        out[budget] = tr.policy.update_actor(tr.algo, eps, *targets, temperature=1.0, ent_coef=0.01, w_bc=0.3, w_rl=0.7)
    pad_whole, pad_micro = out[None].pop("perf/actor_padding"), out[SMALL].pop("perf/actor_padding")
    assert pad_micro < pad_whole
    assert set(out[None]) == set(out[SMALL])
    for k, v in out[None].items():
        assert out[SMALL][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_micro_batches_fit_the_budget_and_cut_padding():
    rng = random.Random(0)
    # Episode lengths skewed as the demo's are (median ~100 tokens, a few near 400), one segment each.
    lengths = [int(min(450, 30 + rng.lognormvariate(4.2, 0.6))) for _ in range(32)]
    rows = [[n] for n in lengths]
    groups = micro_batches(rows, 1024)
    assert sorted(i for g in groups for i in g) == list(range(32))
    for g in groups:
        real, padded = padded_tokens([rows[i] for i in g])
        assert padded <= 1024 or len(g) == 1
        assert [lengths[i] for i in g] == sorted((lengths[i] for i in g), reverse=True)
    real, padded = padded_tokens(rows)
    whole = 1 - real / padded
    micro = 1 - real / sum(padded_tokens([rows[i] for i in g])[1] for g in groups)
    assert whole > 0.4 and micro < 0.15
    assert micro_batches(rows, None) == [sorted(range(32), key=lambda i: (-lengths[i], i))]
    assert micro_batches([[5000], [10]], 1024) == [[0], [1]]  # an item over the budget runs alone
    assert micro_batches([[30, 20], [25]], 90) == [[0, 1]]  # an item's segments stay together: 3 rows x 30


def test_length_batches_cover_an_epoch_once():
    lengths = [random.Random(1).randint(5, 200) for _ in range(100)]
    batches = length_batches(lengths, 16, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(100))
    assert batches == length_batches(lengths, 16, random.Random(0))


def _critic_trainer(tmp_path, make_cfg, budget: int | None) -> Trainer:
    # critic.max_len 512: states keep their own lengths (at the test config's 128 most are cut to the same
    # length, and micro-batching by length has no padding to save).
    return Trainer(make_cfg(tmp_path, "critic.epochs=1", "critic.minibatch=512", "critic.value_clip=0.2",
                            "critic.q=true", "critic.max_len=512",
                            f"critic.microbatch_tokens={'null' if budget is None else budget}"))


def test_critic_micro_batches_and_encoded_rows(tmp_path, make_cfg):
    tr = _critic_trainer(tmp_path / "a", make_cfg, None)
    eps = _collect(tr)
    learner = tr.critic
    inputs = [state_input(ep, t) for ep in eps for t in range(len(ep.turns))]
    enc = learner.critic.encode(inputs)
    rows = [5, 0, 3]
    alone = learner.critic.encode([inputs[i] for i in rows])
    sliced = encoded_rows(enc, rows)
    assert set(sliced) == set(alone) and all(torch.equal(sliced[k], alone[k]) for k in alone)
    t = max(len(ep.turns) for ep in eps)
    returns, old = torch.randn(len(eps), t), torch.randn(len(eps), t)
    # One minibatch of every state: the statistics are the minibatch's before the step, whatever the split.
    other = _critic_trainer(tmp_path / "b", make_cfg, 512).critic
    other.critic.load_state_dict(learner.critic.state_dict())
    whole = learner.update(eps, returns, old, gamma=0.9)
    micro = other.update(eps, returns, old, gamma=0.9)
    assert micro.pop("perf/critic_padding") < whole.pop("perf/critic_padding")
    assert set(whole) == {"losses/value_loss", "losses/q_loss", "grad/critic_norm"} == set(micro)
    for k, v in whole.items():
        assert micro[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_critic_bucketing_is_deterministic_and_resumes_exactly(tmp_path, make_cfg):
    tr = Trainer(make_cfg(tmp_path / "a", "critic.epochs=2", "critic.minibatch=8"))
    eps = _collect(tr)
    t = max(len(ep.turns) for ep in eps)
    returns, old = torch.randn(len(eps), t), torch.randn(len(eps), t)
    learner = tr.critic
    learner.update(eps, returns, old, gamma=0.9)
    learner.save(tmp_path / "ckpt")
    resumed = Trainer(make_cfg(tmp_path / "b", "critic.epochs=2", "critic.minibatch=8", "run.seed=7")).critic
    resumed.load(tmp_path / "ckpt")
    resumed.opt.load_state_dict(copy.deepcopy(learner.opt.state_dict()))  # not shared: load_state_dict keeps tensors
    a = learner.update(eps, returns, old, gamma=0.9)
    b = resumed.update(eps, returns, old, gamma=0.9)
    assert a == b and a["perf/critic_padding"] < 0.5
    for k, v in learner.critic.state_dict().items():
        assert torch.equal(v, resumed.critic.state_dict()[k]), k
