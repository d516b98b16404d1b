"""One PPO update moves a positive-advantage action up and a negative-advantage action down; rft imitates
the successful episodes only."""

from __future__ import annotations

import torch

from polyturn.algos.bc import bc_loss
from polyturn.rollout.context import Conversation
from polyturn.rollout.types import Episode, Turn
from polyturn.train.batch import make_token_batch, policy_output
from polyturn.train.trainer import Trainer

TASK = "Which 3 products had the highest revenue in East China?"
GOOD = "Action: list_tables[{}]"
BAD = 'Action: describe_table[{"table": "sales"}]'


def _one_turn(tr: Trainer, action: str, *, success: bool = False) -> Episode:
    """A one-turn episode on TASK whose behaviour log-probs are the current policy's (ratio 1 at the start)."""
    conv = Conversation(tr.actor, tr.settings, task=TASK, system=None)
    ids = tr.actor.encode(action) + [tr.actor.stop_id]
    conv.add_action(ids, [0.0] * len(ids), turn=0, text=action)
    seg = conv.segments[0]
    batch = make_token_batch([(0, seg)], pad_id=tr.actor.pad_id)
    with torch.no_grad():
        lp = policy_output(tr.actor, batch).logprobs[0]
    seg.logprobs = [0.0] + [float(x) if m else 0.0 for x, m in zip(lp, batch.action_mask[0])]
    turn = Turn(observation=TASK, action=action, action_ids=ids, logprobs=seg.logprobs[-len(ids):], reward=0.0,
                reward_terms={}, terminated=True, truncated=False, info={"success": success}, privileged="",
                features={})
    return Episode(env_id="e", seed=0, task_id="t", question=TASK, level=1, ambiguous=False, key_actions=[],
                   turns=[turn], segments=conv.segments)


def _action_logprob(tr: Trainer, ep: Episode) -> float:
    batch = make_token_batch([(0, s) for s in ep.segments], pad_id=tr.actor.pad_id)
    with torch.no_grad():
        return float(policy_output(tr.actor, batch).logprobs.sum())


def test_one_ppo_update_moves_each_action_the_way_of_its_advantage(tmp_path, make_cfg):
    tr = Trainer(make_cfg(tmp_path, "actor.warmup_steps=0", "actor.lr=1e-3", "ppo.minibatch_episodes=2",
                          "ppo.epochs=1"))
    good, bad = _one_turn(tr, GOOD), _one_turn(tr, BAD)
    before = [_action_logprob(tr, good), _action_logprob(tr, bad)]
    assert abs(before[0] - sum(good.turns[0].logprobs)) < 1e-4  # the behaviour log-probs are the policy's
    adv = torch.tensor([[1.0], [-1.0]])
    m = tr.policy.update_actor(tr.algo, [good, bad], adv, torch.zeros(2, 1), torch.zeros(2, 1), temperature=1.0, ent_coef=0.0,
                        w_bc=0.0, w_rl=1.0)
    after = [_action_logprob(tr, good), _action_logprob(tr, bad)]
    assert m["losses/clipfrac"] == 0.0 and abs(m["losses/approx_kl"]) < 1e-6  # the first minibatch is on-policy
    assert after[0] > before[0] + 1e-3
    assert after[1] < before[1] - 1e-3


def test_a_minibatch_far_off_policy_is_not_stepped_and_ends_the_update(tmp_path, make_cfg):
    tr = Trainer(make_cfg(tmp_path, "actor.warmup_steps=0", "actor.lr=1e-3", "ppo.minibatch_episodes=1",
                          "ppo.epochs=3", "ppo.target_kl=0.01"))
    good, bad = _one_turn(tr, GOOD), _one_turn(tr, BAD)
    for seg in bad.segments:  # the behaviour policy put 0.5 nats more on each of bad's tokens: far off-policy
        seg.logprobs = [lp + 0.5 if m else lp for lp, m in zip(seg.logprobs, seg.action_mask)]
    weights = [p.detach().clone() for p in tr.actor.trainable_parameters()]
    tr.py_rng.seed(0)
    m = tr.policy.update_actor(tr.algo, [bad, good], torch.tensor([[1.0], [1.0]]), torch.zeros(2, 1), torch.zeros(2, 1),
                        temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0)
    assert m["losses/kl_stop"] == 1.0 and m["losses/declined_approx_kl"] > 0.02
    assert m["losses/declined_ratio_mean"] < 0.7  # e^-0.5 per token
    moved = any(not torch.equal(a, b) for a, b in zip(weights, tr.actor.trainable_parameters()))
    stepped = "grad/actor_norm" in m  # the on-policy minibatch ran first (and stepped) or not at all
    assert moved == stepped
    # The iteration's means are of the stepped minibatches only (none, or the on-policy one: ratio 1).
    assert ("losses/approx_kl" in m) == stepped and m.get("losses/approx_kl", 0.0) < 1e-6
    tr2 = Trainer(make_cfg(tmp_path / "b", "actor.warmup_steps=0", "actor.lr=1e-3", "ppo.minibatch_episodes=1",
                           "ppo.epochs=3", "ppo.target_kl=null"))
    good2, bad2 = _one_turn(tr2, GOOD), _one_turn(tr2, BAD)
    for seg in bad2.segments:
        seg.logprobs = [lp + 0.5 if m else lp for lp, m in zip(seg.logprobs, seg.action_mask)]
    m2 = tr2.policy.update_actor(tr2.algo, [bad2, good2], torch.tensor([[1.0], [1.0]]), torch.zeros(2, 1), torch.zeros(2, 1),
                          temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0)
    assert "losses/kl_stop" not in m2  # no limit: every minibatch of every epoch is stepped


def test_dual_clip_leaves_a_negative_advantage_action_whose_ratio_exploded_alone(tmp_path, make_cfg):
    """The behaviour policy gave each of the action's tokens 3 nats less than the current policy does (a rare
    or forced sample since made likelier: ratio e^3 = 20 per token) and its advantage is negative: without
    dual-clip PPO pushes it down with 20x the weight; with ``ppo.dual_clip=3`` it contributes no gradient."""
    for dual, moves in ((None, True), (3.0, False)):
        extra = [f"ppo.dual_clip={dual}"] if dual else []
        tr = Trainer(make_cfg(tmp_path / str(dual), "actor.warmup_steps=0", "actor.lr=1e-3",
                              "ppo.minibatch_episodes=1", "ppo.epochs=1", "ppo.target_kl=null", *extra))
        ep = _one_turn(tr, BAD)
        for seg in ep.segments:
            seg.logprobs = [lp - 3.0 if m else lp for lp, m in zip(seg.logprobs, seg.action_mask)]
        before = _action_logprob(tr, ep)
        m = tr.policy.update_actor(tr.algo, [ep], torch.tensor([[-1.0]]), torch.zeros(1, 1), torch.zeros(1, 1), temperature=1.0,
                            ent_coef=0.0, w_bc=0.0, w_rl=1.0)
        assert m["losses/ratio_mean"] > 19.0
        after = _action_logprob(tr, ep)
        if moves:
            assert after < before - 1e-3 and "losses/dual_clipfrac" not in m
        else:
            # No gradient at all (what moves is AdamW's weight decay alone: ~4e-6 nats here).
            assert m["grad/actor_norm"] == 0.0 and m["losses/dual_clipfrac"] == 1.0
            assert abs(after - before) < 1e-4


def test_the_progress_line_shows_a_declined_minibatch():
    from polyturn.console import metric_line

    line = metric_line("ppo", 7, {"losses/approx_kl": 0.001, "losses/declined_approx_kl": 0.52}, terms=False)
    assert "kl=0.0010" in line and "kl_declined=0.52" in line
    assert "kl_declined" not in metric_line("ppo", 8, {"losses/approx_kl": 0.001}, terms=False)


def test_rft_steps_on_the_successful_episodes_only_with_every_epoch(tmp_path, make_cfg):
    tr = Trainer(make_cfg(tmp_path, "ppo.algo=rft", "actor.warmup_steps=0", "actor.lr=1e-3",
                          "ppo.minibatch_episodes=2", "ppo.epochs=3", "ppo.target_kl=0.001"))
    good, bad = _one_turn(tr, GOOD, success=True), _one_turn(tr, BAD, success=False)
    adv = torch.tensor([[-3.0], [2.0]])  # whatever the advantages say: rft reads success
    chosen, rft_adv, _ = tr.algo.select([bad, good], adv, torch.ones(2, 1))
    assert chosen == [1] and rft_adv.tolist() == [[1.0], [1.0]]
    before = _action_logprob(tr, good)
    m = tr.policy.update_actor(tr.algo, [good], rft_adv[chosen], torch.zeros(1, 1), torch.zeros(1, 1), temperature=1.0,
                        ent_coef=0.0, w_bc=0.0, w_rl=1.0)
    assert _action_logprob(tr, good) > before + 1e-3
    # No KL limit acts on the fine-tuning loss: all three epochs step, past a target_kl the imitation exceeds.
    assert "losses/kl_stop" not in m and tr.policy.steps == 3
    assert abs(m["losses/policy_loss"] + before / len(good.turns[0].action_ids)) < 0.5  # a token-mean NLL
    ppo = Trainer(make_cfg(tmp_path / "ppo", "ppo.algo=ppo"))
    assert ppo.algo.select([bad, good], adv, torch.ones(2, 1))[:2] == ([0, 1], adv)


def test_rft_valid_only_drops_a_success_reached_through_an_invalid_action(tmp_path, make_cfg, make_episodes):
    tr = Trainer(make_cfg(tmp_path, "ppo.algo=rft", "critic.kind=none"))
    success, limit, cut = make_episodes(tr.actor)
    success.turns[0].info["action_valid"] = False  # a malformed first call, then the right answer
    clean = make_episodes(tr.actor)[0]
    eps, mask = [success, limit, clean, cut], torch.ones(4, 3)
    assert tr.algo.select(eps, mask, mask)[0] == [0, 2]
    strict = Trainer(make_cfg(tmp_path / "strict", "ppo.algo=rft", "critic.kind=none", "ppo.rft_valid_only=true"))
    assert strict.algo.select(eps, mask, mask)[0] == [2]


def test_rft_skip_error_turns_weights_zero_the_turns_the_env_answered_with_an_error(tmp_path, make_cfg, make_episodes):
    skip = Trainer(make_cfg(tmp_path, "ppo.algo=rft", "critic.kind=none", "ppo.rft_skip_error_turns=true"))
    success, limit, _ = make_episodes(skip.actor)
    success.turns[0].info["error"] = "failed"  # a failed call, then the recovery that succeeded
    assert len(success.turns) == 2
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    chosen, w, m = skip.algo.select([success, limit], mask, mask)
    assert chosen == [0] and w[0].tolist() == [0.0, 1.0, 0.0] and m["rft/error_turns_skipped"] == 1
    plain = Trainer(make_cfg(tmp_path / "plain", "ppo.algo=rft", "critic.kind=none"))
    assert plain.algo.select([success, limit], mask, mask)[1][0].tolist() == [1.0, 1.0, 0.0]
    # critic_rft with rft's episodes: the error turn gets no weight and the rest are rescaled to mean 1
    awr = Trainer(make_cfg(tmp_path / "awr", "critic.kind=action", "ppo.algo=critic_rft",
                           "ppo.awr_successes_only=true", "ppo.rft_skip_error_turns=true"))
    chosen, w, _ = awr.algo.select([success, limit], torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]), mask)
    assert chosen == [0] and w[0].tolist() == [0.0, 1.0, 0.0]


def test_rft_skip_wasted_turns_weights_zero_the_turns_the_env_marked_pointless(tmp_path, make_cfg, make_episodes):
    both = Trainer(make_cfg(tmp_path, "ppo.algo=rft", "critic.kind=none", "ppo.rft_skip_wasted_turns=true",
                            "ppo.rft_skip_error_turns=true"))
    success, limit, _ = make_episodes(both.actor)
    success.turns[0].info["wasted"] = True  # a pointless question, then the answer that succeeded
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    chosen, w, m = both.algo.select([success, limit], mask, mask)
    assert chosen == [0] and w[0].tolist() == [0.0, 1.0, 0.0]
    assert m["rft/wasted_turns_skipped"] == 1 and m["rft/error_turns_skipped"] == 0
    errors_only = Trainer(make_cfg(tmp_path / "e", "ppo.algo=rft", "critic.kind=none", "ppo.rft_skip_error_turns=true"))
    assert errors_only.algo.select([success, limit], mask, mask)[1][0].tolist() == [1.0, 1.0, 0.0]
    awr = Trainer(make_cfg(tmp_path / "awr", "critic.kind=action", "ppo.algo=critic_rft",
                           "ppo.awr_successes_only=true", "ppo.rft_skip_wasted_turns=true"))
    chosen, w, _ = awr.algo.select([success, limit], torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]), mask)
    assert chosen == [0] and w[0].tolist() == [0.0, 1.0, 0.0]


def test_an_rft_iteration_imitates_its_successful_episodes_and_without_one_takes_no_step(tmp_path, make_cfg,
                                                                                        make_episodes):
    tr = Trainer(make_cfg(tmp_path, "ppo.algo=rft", "critic.kind=none", "curriculum.warmup_iters=0",
                          "curriculum.mixed_iters=0", "actor.warmup_steps=0", "actor.lr=1e-3"))
    success, limit, cut = make_episodes(tr.actor)
    assert [ep.success for ep in (success, limit, cut)] == [True, False, False]
    before = _action_logprob(tr, success)
    m = tr.learn(0, [limit, success, cut], gen_s=1.0)
    assert m["rft/kept"] == 1 and m["charts/success_rate"] == 1 / 3 and "losses/policy_loss" in m
    assert _action_logprob(tr, success) > before + 1e-3
    weights = [p.detach().clone() for p in tr.actor.trainable_parameters()]
    m = tr.learn(1, [limit, cut], gen_s=1.0)
    assert m["rft/kept"] == 0 and "losses/policy_loss" not in m
    assert all(torch.equal(a, b) for a, b in zip(weights, tr.actor.trainable_parameters()))
    from polyturn.console import metric_line

    assert "kept=0" in metric_line("ppo", 1, m, terms=False)


def test_a_mixed_rft_iteration_adds_the_bc_loss_of_demonstrations(tmp_path, make_cfg, make_episodes):
    tr = Trainer(make_cfg(tmp_path, "ppo.algo=rft", "critic.kind=none", "curriculum.warmup_iters=0",
                          "curriculum.mixed_iters=1", "curriculum.w_bc=0.5", "curriculum.w_rl=0.5",
                          "actor.warmup_steps=0", "actor.lr=1e-3", "ppo.epochs=1"))
    assert tr.phase_of(0) == "mixed"
    tr.policy.demos = tr.policy.demos[:1]  # the one demonstration the minibatch can draw
    success, limit, cut = make_episodes(tr.actor)
    demo = make_token_batch([(0, s) for s in tr.policy.demos[0]], pad_id=tr.actor.pad_id)

    def demo_nll() -> float:
        with torch.no_grad():
            return float(bc_loss(policy_output(tr.actor, demo).logprobs, demo.action_mask)["loss"])

    nll_before = demo_nll()
    m = tr.learn(0, [limit, success, cut], gen_s=1.0)
    assert m["rft/kept"] == 1 and "losses/policy_loss" in m
    # The minibatch's loss holds the demonstration's BC loss (logged before the step) with the kept episode's.
    assert abs(m["losses/bc_loss"] - nll_before) < 1e-3
    assert demo_nll() < nll_before - 1e-3
    pure = Trainer(make_cfg(tmp_path / "pure", "ppo.algo=rft", "critic.kind=none", "curriculum.warmup_iters=0",
                            "curriculum.mixed_iters=0", "actor.warmup_steps=0", "actor.lr=1e-3"))
    assert "losses/bc_loss" not in pure.learn(0, make_episodes(pure.actor), gen_s=1.0)


def test_decoupled_ppo_reads_the_proximal_policy_so_stale_turns_are_weighted_not_clipped(tmp_path, make_cfg):
    """Turns sampled by an older policy (recorded log-probs 0.3 nats off): plain PPO's first ratio is e^-0.3 and
    clips; decoupled PPO's first ratio is 1 (the proximal policy is the learner's own) and the recorded log-probs
    enter only as the weight pi_prox / pi_behaviour = e^-0.3."""
    metrics = {}
    for decoupled in (False, True):
        tr = Trainer(make_cfg(tmp_path / str(decoupled), "actor.warmup_steps=0", "actor.lr=1e-3", "ppo.epochs=1",
                              "ppo.minibatch_episodes=2", "ppo.target_kl=null", f"ppo.decoupled={decoupled}"))
        eps = [_one_turn(tr, GOOD), _one_turn(tr, BAD)]
        for ep in eps:
            for seg in ep.segments:
                seg.logprobs = [lp + 0.3 if m else lp for lp, m in zip(seg.logprobs, seg.action_mask)]
        before = _action_logprob(tr, eps[0])
        metrics[decoupled] = tr.policy.update_actor(tr.algo, eps, torch.tensor([[1.0], [-1.0]]), torch.zeros(2, 1),
                                             torch.zeros(2, 1), temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0)
        assert _action_logprob(tr, eps[0]) > before + 1e-4  # both still learn from the stale turns
    plain, dec = metrics[False], metrics[True]
    assert abs(plain["losses/ratio_mean"] - torch.tensor(-0.3).exp().item()) < 1e-3 and plain["losses/clipfrac"] > 0
    assert abs(dec["losses/ratio_mean"] - 1.0) < 1e-4 and dec["losses/clipfrac"] == 0.0
    assert abs(dec["losses/behaviour_weight"] - torch.tensor(-0.3).exp().item()) < 1e-3
    assert dec["losses/behaviour_capped"] == 0.0 and "losses/behaviour_weight" not in plain


def test_rft_error_unlikelihood_pushes_down_a_failed_episodes_likely_error_turn(tmp_path, make_cfg):
    """ppo.error_unlikelihood: a failed episode's error turn (here a repeat the policy has come to like) is pushed
    down beside the imitation of the success; an error turn the policy finds unlikely costs ~nothing."""
    base = ("ppo.algo=rft", "critic.kind=none", "curriculum.warmup_iters=0", "curriculum.mixed_iters=0",
            "actor.warmup_steps=0", "actor.lr=1e-2", "ppo.epochs=1", "ppo.minibatch_episodes=4")
    drops, metrics = {}, {}
    for ul in (0.0, 1.0):
        tr = Trainer(make_cfg(tmp_path / f"ul{ul}", *base, f"ppo.error_unlikelihood={ul}"))
        for _ in range(30):  # make BAD likely first, as a loop's repeated call is (imitating it as a success)
            tr.policy.update_actor(tr.algo, [_one_turn(tr, BAD, success=True)], torch.ones(1, 1), torch.zeros(1, 1),
                            torch.zeros(1, 1), temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0)
        good, repeat = _one_turn(tr, GOOD, success=True), _one_turn(tr, BAD, success=False)
        repeat.turns[0].info["error"] = "repeat"
        before = _action_logprob(tr, repeat)
        assert before > -2.0, before  # p(BAD) > 0.13: the policy would write it again
        metrics[ul] = tr.learn(0, [repeat, good], gen_s=1.0)
        drops[ul] = before - _action_logprob(tr, repeat)
    m = metrics[1.0]
    assert m["rft/kept"] == 1 and m["rft/error_turns_pushed"] == 1 and m["rft/error_episodes"] == 1
    assert m["losses/error_unlikelihood"] > 0.1 and m["rft/error_action_prob"] > 0.1
    assert "losses/error_unlikelihood" not in metrics[0.0] and "rft/error_turns_pushed" not in metrics[0.0]
    assert drops[1.0] > drops[0.0] + 0.05, drops
    # With no success to imitate, the error turns still make one step of their own.
    before = _action_logprob(tr, repeat)
    m = tr.learn(1, [repeat], gen_s=1.0)
    assert m["rft/kept"] == 0 and m["losses/error_unlikelihood"] > 0 and _action_logprob(tr, repeat) < before - 0.01
    # In the mixed phase such a step keeps its BC anchor: a minibatch of demonstrations beside the term alone.
    empty = torch.zeros(0, 1)
    m = tr.policy.update_actor(tr.algo, [], empty, empty, empty, temperature=1.0, ent_coef=0.0, w_bc=0.3, w_rl=0.7,
                               negatives=([repeat], torch.ones(1, 1)))
    assert m["losses/bc_loss"] > 0 and m["losses/error_unlikelihood"] > 0


def test_action_unlikelihood_sums_an_actions_tokens_across_rows() -> None:
    import math

    import pytest

    from polyturn.algos.bc import action_unlikelihood

    lp = torch.tensor([[-0.1, -0.2, -5.0, 0.0], [-0.3, -1.0, 0.0, 0.0]], requires_grad=True)
    aid = torch.tensor([[0, 0, 2, -1], [0, 2, -1, -1]])  # action 0: three tokens over two rows; 1: none
    out = action_unlikelihood(lp, aid)
    p0, p2 = math.exp(-0.6), math.exp(-6.0)
    assert out["loss"].item() == pytest.approx((-math.log1p(-p0) - math.log1p(-p2)) / 2, rel=1e-5)
    assert out["actions"].item() == 2 and out["action_prob"].item() == pytest.approx((p0 + p2) / 2, rel=1e-5)
    out["loss"].backward()
    assert lp.grad[0, 0].item() == pytest.approx(p0 / (1 - p0) / 2, rel=1e-4)  # d/dlogp: p / (1 - p), mean of 2
    assert lp.grad[0, 2].item() < 1e-2 and lp.grad[0, 3].item() == 0.0  # an unlikely action barely moves
    certain = action_unlikelihood(torch.zeros(1, 2, requires_grad=True), torch.tensor([[0, 0]]))
    assert torch.isfinite(certain["loss"])  # p = 1 clamped
    none = action_unlikelihood(lp, torch.full((2, 4), -1))
    assert none["loss"].item() == 0.0 and none["actions"].item() == 0
    with pytest.raises(ValueError, match="integer action_id"):
        action_unlikelihood(lp, aid.float())
