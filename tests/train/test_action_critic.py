"""The action-level critic (critic.kind: action) and the three actor updates that read it, on tiny models."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyturn.models.action_critic import load_action_critic
from polyturn.models.causal_critic import CausalCritic
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.candidates import turn_context
from polyturn.rollout.branches import BranchPoint
from polyturn.train.critics.action import (branch_pairs, first_difference, pair_accuracy, preference_pairs,
                                           turn_inputs)
from polyturn.train.batch import make_token_batch, policy_output
from polyturn.train.critics import turn_tensors
from polyturn.train.trainer import Trainer
from polyturn.train.turn_dpo import collect_pairs, dpo_pairs
from tests.conftest import StepsReporter

#: Two iterations of RL (one mixed, one pure), no warm-up: each actor update runs twice.
TWO_ITERS = ("curriculum.warmup_iters=0", "curriculum.mixed_iters=1", "curriculum.ppo_iters=1", "critic.kind=action",
             "env.eval_episodes=2", "ppo.episodes_per_iter=4", "rollout.num_envs=4", "env.kwargs={max_turns: 3}",
             "ppo.dpo_states=4")
INPUTS = [CriticInput(task="Which product sold most?", history=[("Action: list_tables[{}]", "Tables: sales")],
                      privileged="gold: widget", action=a) for a in ("Action: answer[widget]", "Action: ask[which?]")]


def _scores(critic, inputs=INPUTS) -> torch.Tensor:
    critic.eval()
    with torch.no_grad():
        return critic.scores(inputs)


def test_dpo_pairs_are_the_top_half_against_the_bottom_half():
    assert dpo_pairs([0.1, 0.9, 0.5, 0.3]) == [(1, 3), (2, 0)]
    assert dpo_pairs([0.2, 0.7, 0.4]) == [(1, 0)]  # odd: the middle one sits out
    assert dpo_pairs([1.0, 1.0]) == []  # a tie says nothing


def test_turn_dpo_pairs_come_from_one_state_with_the_samplers_log_probs(tmp_path, make_cfg):
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "ppo.algo=turn_dpo", "ppo.dpo_states=4", "ppo.dpo_candidates=4"))
    tr.actor.model.eval()
    eps = tr.collector.collect([{"seed": 500 + i, "options": {}} for i in range(4)], temperature=1.0,
                               generator=tr.gen)
    pairs, m = collect_pairs(tr.policy, eps, temperature=1.0)
    contexts = [turn_context(ep, t) for ep in eps for t in range(len(ep.turns))]
    assert pairs and m["dpo/pairs"] == len(pairs)
    for pr in pairs:
        assert pr.context in contexts  # a state of a collected episode, the same for both candidates
        for act in (pr.chosen, pr.rejected):
            batch = make_token_batch([(0, pr.segment(act))], pad_id=tr.actor.pad_id)
            with torch.no_grad():
                lp = policy_output(tr.actor, batch, temperature=1.0).logprobs[0][batch.action_mask[0].bool()]
            assert lp.tolist() == pytest.approx(act.logprobs, abs=1e-4)
    # The pairs are ranked by the critic: the chosen candidate scores higher.
    pr = pairs[0]
    i, t = next((i, t) for i, ep in enumerate(eps) for t in range(len(ep.turns)) if turn_context(ep, t) == pr.context)
    texts = [tr.actor.tokenizer.decode(a.ids[:-1] if not a.hit_cap else a.ids) for a in (pr.chosen, pr.rejected)]
    inputs = [CriticInput(task=eps[i].question, history=eps[i].history(t), privileged=eps[i].turns[t].privileged,
                          action=x, features=eps[i].turns[t].features) for x in texts]
    s = tr.critic.score_candidates(inputs)
    assert s[0] > s[1]


def test_turn_dpo_counts_its_update_steps_on_the_reporter(tmp_path, make_cfg):
    rep = StepsReporter()
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "ppo.algo=turn_dpo", "ppo.minibatch_episodes=1", "ppo.epochs=2"),
                 reporter=rep)
    tr.policy.set_reference()  # as RL's start does
    metrics = tr.rl_iteration(1)
    update = next(row for row in rep.steps if row[0] == "update")
    assert metrics["dpo/pairs"] > 0 and update == ["update", 2 * metrics["dpo/pairs"], 2 * metrics["dpo/pairs"]]


@pytest.mark.parametrize("reference", ["bc", "behaviour"])
def test_turn_dpo_measures_its_implicit_rewards_from_the_chosen_reference(tmp_path, make_cfg, reference):
    from polyturn.algos.preference import dpo_loss
    from polyturn.train.batch import MicroStats
    from polyturn.train.turn_dpo import TurnDPO

    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "ppo.algo=turn_dpo", f"ppo.dpo_reference={reference}"))
    tr.policy.set_reference()
    assert (tr.policy.ref_actor is not None) == (reference == "bc")

    def nudge():
        with torch.no_grad():
            for prm in tr.actor.trainable_parameters():
                prm.add_(0.05 * torch.randn_like(prm))

    nudge()  # the sampler now differs from the BC reference ...
    eps = tr.collector.collect([{"seed": 600 + i, "options": {}} for i in range(4)], temperature=1.0,
                               generator=tr.gen)
    pairs, _ = collect_pairs(tr.policy, eps, temperature=1.0)
    assert pairs
    nudge()  # ... and the policy being trained from both
    segs = [pr.segment(pr.chosen) for pr in pairs] + [pr.segment(pr.rejected) for pr in pairs]
    batch = make_token_batch(list(enumerate(segs)), pad_id=tr.actor.pad_id)
    n = len(pairs)
    with torch.no_grad():
        lp = (policy_output(tr.actor, batch, temperature=1.0).logprobs * batch.action_mask).sum(1)
        sampler = (batch.old_logprobs * batch.action_mask).sum(1)
        bc = (tr.policy.ref_logprobs(batch, 1.0) * batch.action_mask).sum(1) if reference == "bc" else sampler
        assert reference == "behaviour" or (bc - sampler).abs().max() > 0.1  # the two references tell apart
        ref = bc if reference == "bc" else sampler
        want = dpo_loss(lp[:n], lp[n:], ref[:n], ref[n:], beta=tr.cfg.ppo.dpo_beta)["loss"]
        with_sampler = dpo_loss(lp[:n], lp[n:], sampler[:n], sampler[n:], beta=tr.cfg.ppo.dpo_beta)["loss"]
        algo = TurnDPO(tr.cfg.ppo)
        algo.set_reference(tr.policy, pairs, temperature=1.0)
        acc = MicroStats()
        list(algo._losses(tr.policy, pairs, acc, temperature=1.0, weight=1.0))
    got = acc.result()["losses/dpo_loss"]
    assert got == pytest.approx(float(want), rel=1e-4)
    if reference == "bc":
        assert got != pytest.approx(float(with_sampler), rel=1e-4)  # not the sampler's log-probs


def test_turn_dpo_reference_is_saved_and_restored_on_resume(tmp_path, make_cfg):
    cfg = make_cfg(tmp_path, *TWO_ITERS, "ppo.algo=turn_dpo", "critic.group_size=2")
    tr = Trainer(cfg)
    tr.run()
    assert (tmp_path / "ckpt-final" / "ref_actor").is_dir()
    again = Trainer(cfg, resume=True)
    assert again.state.iter == 2
    for (k, a), b in zip(tr.policy.ref_actor.model.state_dict().items(), again.policy.ref_actor.model.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("algo", ["turn_dpo", "critic_pg", "critic_rft", "critic_rft+successes"])
def test_two_iterations_of_each_action_critic_update(tmp_path, make_cfg, algo):
    algo, *successes = algo.split("+")  # the success-filtered AWR of configs/sql_smollm2.yaml's comparison
    extra = ["ppo.awr_successes_only=true", "bc.episodes=8", "env.kwargs={max_turns: 6}"] if successes else []
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, f"ppo.algo={algo}", "critic.group_size=2", *extra))
    before = {k: v.clone() for k, v in tr.actor.model.state_dict().items()}
    summary = tr.run()
    assert tr.state.iter == 2 and "final" in summary["eval"]
    logs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [x for x in logs if x.get("phase") in ("mixed", "ppo")]
    assert len(rl) == 2 and all("critic/pairs" in x for x in rl)
    key = {"turn_dpo": "losses/dpo_loss", "critic_pg": "losses/policy_loss", "critic_rft": "awr/weight_mean"}[algo]
    assert any(key in x for x in rl), rl[-1].keys()
    if successes:  # the success filter ran (rft's count is logged by it alone)
        assert all("rft/kept" in x for x in rl)
    moved = any(not torch.equal(before[k], v) for k, v in tr.actor.model.state_dict().items())
    assert moved, "the actor did not change"


def test_critic_rft_with_successes_only_keeps_rfts_episodes_and_spreads_mean_one_weights(tmp_path, make_cfg,
                                                                                        make_episodes):
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "ppo.algo=critic_rft", "ppo.awr_successes_only=true",
                          "ppo.awr_temperature=0.5"))
    success, limit, cut = make_episodes(tr.actor)  # only the first succeeds
    adv = torch.tensor([[0.5, -0.5, 0.0], [1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    chosen, w, m = tr.algo.select([success, limit, cut], adv, mask)
    assert chosen == [0]
    e1, e_1 = torch.exp(torch.tensor(1.0)), torch.exp(torch.tensor(-1.0))  # exp(A / 0.5)
    want = torch.tensor([2 * e1 / (e1 + e_1), 2 * e_1 / (e1 + e_1), 0.0])
    assert torch.allclose(w[0], want) and float(w[0].sum()) == pytest.approx(2.0)  # mean 1 over its 2 turns
    assert m["rft/kept"] == 1 and m["awr/weight_mean"] == pytest.approx(1.0)
    assert m["awr/weight_max"] == pytest.approx(float(want[0]))
    every = Trainer(make_cfg(tmp_path / "all", *TWO_ITERS, "ppo.algo=critic_rft", "ppo.awr_temperature=0.5"))
    chosen, w, _ = every.algo.select([success, limit, cut], adv, mask)  # plain AWR: every episode, raw weights
    assert chosen == [0, 1, 2] and float(w[2, 0]) == 20.0  # exp(2 / 0.5) = 54.6, capped at awr_max_weight


def test_bradley_terry_training_ranks_the_better_episode_of_a_pair_higher(tmp_path, make_cfg, make_episodes):
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "critic.lr=3e-3", "critic.epochs=20"))
    eps = make_episodes(tr.actor)  # one task (seed 0): a success, a turn-limit and a cut episode
    eps[1].turns[0].action_ids = eps[1].turns[0].action_ids[:-2] + [5, tr.actor.stop_id]
    pairs = preference_pairs(eps)
    assert sorted(pairs) == [(0, 1), (0, 2), (2, 1)]  # returns 9.99 > -5.01 > -5.02
    assert first_difference(eps[0], eps[1]) == 0 and first_difference(eps[0], eps[2]) is None
    before = pair_accuracy(eps, tr.critic.turn_scores(eps).detach(), pairs)
    m = tr.critic.update(eps, torch.zeros(1), torch.zeros(1), gamma=0.99)
    assert m["critic/pair_acc"] == before["critic/pair_acc"]  # measured before training on these pairs: held out
    assert m["critic/pair_acc_first_diff"] == before["critic/pair_acc_first_diff"]
    after = pair_accuracy(eps, tr.critic.turn_scores(eps).detach(), pairs)
    assert after["critic/pair_acc"] == 1.0 and m["losses/bt_loss"] > 0
    assert [x.action for x in turn_inputs(eps[0])] == [turn.action for turn in eps[0].turns]


def test_branch_pairs_rank_the_turns_of_one_state_by_return(tmp_path, make_cfg, make_episodes):
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "critic.lr=3e-3", "critic.epochs=20"))
    eps = make_episodes(tr.actor)  # returns 9.99 (success), -5.02 (turn limit), -5.01 (cut); same turns 0-1 states
    other = make_episodes(tr.actor)[0]
    other.turns[0].observation = "another task"  # its state is not the branch point's: not replayed
    eps[1].turns[1].action = "Action: describe_table[sales]"
    eps[1].turns[1].action_ids = tr.actor.encode(eps[1].turns[1].action) + [tr.actor.stop_id]
    # Branch at turn 1 of the success, k = 3: the turn-limit, the cut and the other-task episodes.
    pairs, stats = branch_pairs([eps[0]], [BranchPoint(0, 1)], [eps[1], eps[2], other], 3)
    # The success and the cut took the same turn-1 action and still ended apart: one same-action pair, split.
    assert stats == {"critic/branch_pairs": 2.0, "critic/branch_mismatched": 1.0,
                     "critic/branch_same_action_split": 1.0}
    # success > turn limit, cut > turn limit; success vs cut is dropped: the same turn-1 action.
    assert [(b.action, w.action) for b, w in pairs] == [(eps[0].turns[1].action, eps[1].turns[1].action),
                                                       (eps[2].turns[1].action, eps[1].turns[1].action)]
    for b, w in pairs:  # both from the same state
        assert (b.task, b.history, b.privileged) == (w.task, w.history, w.privileged)
    tr.critic.turn_pairs = list(pairs)
    flat = tr.critic.score_candidates([x for pr in pairs for x in pr])
    before = float((flat[0::2] > flat[1::2]).float().mean())
    m = tr.critic.update(eps, torch.zeros(1), torch.zeros(1), gamma=0.99)
    assert m["critic/branch_acc"] == before  # measured before training on them: held out
    assert m["losses/branch_bt_loss"] > 0 and tr.critic.turn_pairs == []  # used once
    after = tr.critic.score_candidates([x for pr in pairs for x in pr])
    assert bool((after[0::2] > after[1::2]).all())


def test_two_iterations_with_branch_labels(tmp_path, make_cfg):
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "ppo.algo=critic_pg", "critic.group_size=2", "critic.branch_states=2",
                          "critic.branch_candidates=2"))
    tr.run()
    logs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [x for x in logs if x.get("phase") in ("mixed", "ppo")]
    assert len(rl) == 2
    for x in rl:
        assert x["rollout/branch_episodes"] == 4.0 and x["critic/branch_mismatched"] == 0.0
        assert x["rollout/branch_turns"] >= 4.0 and x["perf/branch_gen_s"] > 0
        assert ("critic/branch_acc" in x) == (x["critic/branch_pairs"] > 0)


def test_redistributed_credit_keeps_each_episodes_rloo_sign_and_total(tmp_path, make_cfg, make_episodes):
    tr = Trainer(make_cfg(tmp_path, *TWO_ITERS, "critic.credit=redistribute", "critic.credit_temperature=0.5"))
    eps = make_episodes(tr.actor)  # one task: returns 9.99, -5.02, -5.01
    tt = turn_tensors(eps)
    adv, _ = tr.critic.advantages(eps, tt, torch.zeros(1), torch.zeros(1), gamma=1.0, lam=1.0, reward_scale=1.0)
    rets = torch.tensor([ep.episode_return for ep in eps])
    rloo = torch.stack([rets[i] - (rets.sum() - rets[i]) / 2 for i in range(3)])
    n = tt["mask"].sum(1)
    assert adv.sum(1).tolist() == pytest.approx((rloo * n).tolist(), rel=1e-5)
    for i in range(3):
        turns = adv[i, : int(n[i])]
        assert bool(((turns > 0) if rloo[i] > 0 else (turns < 0)).all())
    scores = tr.critic.turn_scores(eps).detach()
    assert len(eps[0].turns) == 2 and scores[0, 0] != scores[0, 1]
    assert (adv[0, 0] > adv[0, 1]) == (scores[0, 0] > scores[0, 1])  # more credit to the success's higher-scored turn
    # Logged by update(): the largest turn's share over an even split, by hand from the scores (T = 0.5).
    want = [float(n[i]) * torch.softmax(torch.sign(rloo[i]) * scores[i, : int(n[i])] / 0.5, 0).max().item()
            for i in range(3)]
    logged = tr.critic.update(eps, torch.zeros(1), torch.zeros(1), gamma=1.0)["critic/credit_top_share_x_turns"]
    assert logged == pytest.approx(sum(want) / 3, rel=1e-5) and logged > 1.0


def test_causal_critic_saves_loads_and_resumes(tmp_path, make_cfg, local_model):
    args = (*TWO_ITERS, "ppo.algo=critic_pg", "critic.encoder=causal", f"critic.path={local_model}", "critic.lr=1e-3",
            "critic.group_size=2")
    tr = Trainer(make_cfg(tmp_path, *args, "curriculum.ppo_iters=0"))
    eps = tr.collector.collect([{"seed": 0, "options": {}}], temperature=1.0, generator=tr.gen)
    tr.critic.update([eps[0], _worse(eps[0])], torch.zeros(1), torch.zeros(1), gamma=0.99)  # one sure pair
    tr.run()
    trained = _scores(tr.critic.critic)
    assert trained.abs().max() > 0  # log_ratio scores start at exactly 0: it trained
    critic_dir = tmp_path / (tmp_path / "latest").read_text().strip() / "critic"
    AutoModelForCausalLM.from_pretrained(critic_dir / "model")  # HF format: any transformers user opens it
    loaded = load_action_critic(critic_dir)
    assert isinstance(loaded, CausalCritic) and loaded.config.param == "log_ratio"
    assert torch.allclose(_scores(loaded), trained, atol=1e-6)
    resumed = Trainer(make_cfg(tmp_path, *args, "curriculum.ppo_iters=1"), resume=True)
    assert torch.allclose(_scores(resumed.critic.critic), trained, atol=1e-6)
    resumed.run()
    assert resumed.state.iter == 2


def _worse(ep):
    """A copy of ``ep`` that earned 1 less on its first turn (the same task: a Bradley-Terry pair)."""
    import copy

    worse = copy.deepcopy(ep)
    worse.turns[0].reward -= 1.0
    return worse


def test_causal_critic_with_a_head_saves_and_loads(tmp_path, local_model):
    from polyturn.models.actor import load_base
    from polyturn.models.causal_critic import CausalCriticConfig

    model, tok, _ = load_base("local", str(local_model))
    critic = CausalCritic(model=model, tokenizer=tok, config=CausalCriticConfig(param="head", max_len=64))
    torch.nn.init.normal_(critic.head.weight)
    assert not any(p.requires_grad is False for p in critic.parameters())  # no frozen reference to carry
    critic.save_pretrained(tmp_path / "c")
    loaded = load_action_critic(tmp_path / "c")
    assert torch.allclose(_scores(loaded), _scores(critic), atol=1e-6)
    assert _scores(critic)[0] != _scores(critic)[1]


def test_action_critic_choices_need_critic_kind_action(make_cfg, tmp_path):
    from polyturn.train.trainer import check_run

    for extra in (["ppo.algo=turn_dpo"], ["rollout.best_of=4"], ["critic.encoder=causal"], ["critic.branch_states=4"]):
        with pytest.raises(ValueError, match="critic.kind=action"):
            check_run(make_cfg(tmp_path, *extra))
    with pytest.raises(ValueError, match="rollout.workers=0"):
        check_run(make_cfg(tmp_path, "critic.kind=action", "critic.branch_states=4", "rollout.workers=1"))


def test_turn_pair_accuracy_counts_ties_half_and_training_on_the_pairs_ranks_them(local_model):
    from polyturn.config import CriticConfig
    from polyturn.models.actor import load_base
    from polyturn.models.causal_critic import CausalCriticConfig
    from polyturn.runtime import Runtime
    from polyturn.train.critics.action import ActionLearner

    model, tok, _ = load_base("local", str(local_model))
    critic = CausalCritic(model=model, tokenizer=tok, config=CausalCriticConfig(max_len=64))  # log_ratio
    learner = ActionLearner(critic, CriticConfig(kind="action", encoder="causal", lr=1e-3, minibatch=4))
    learner.to(Runtime.from_config("cpu", "fp32"))
    pairs = [(INPUTS[0], INPUTS[1])]
    assert learner.turn_pair_accuracy(pairs) == 0.5  # every log-ratio score starts at 0: all ties, chance
    losses = learner.train_turn_pairs(pairs, epochs=5)
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert learner.turn_pair_accuracy(pairs) == 1.0
    assert learner.turn_pair_accuracy([(INPUTS[1], INPUTS[0])]) == 0.0


def test_causal_critic_cuts_the_oldest_turns_and_keeps_the_privileged_text(local_model):
    from polyturn.models.actor import load_base
    from polyturn.models.causal_critic import CausalCriticConfig

    model, tok, _ = load_base("local", str(local_model))
    critic = CausalCritic(model=model, tokenizer=tok, config=CausalCriticConfig(param="head", max_len=160))
    long = CriticInput(task="Which product sold most?", privileged="gold: widget",
                       history=[(f"Action: run_sql[{{\"sql\": \"SELECT {k}\"}}]", f"row {k}") for k in range(40)],
                       action="Action: answer[widget]")
    batch = critic.encode([long])
    ids = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    text = tok.decode(ids)
    assert len(ids) <= 160 and text.startswith("[PRIVILEGED] gold: widget\n[TASK] Which product sold most?")
    assert text.endswith("answer[widget]") and "row 39" in text and "row 0\n" not in text
    am = batch["action_mask"][0].bool()
    assert tok.decode(batch["input_ids"][0][am]).strip() == "Action: answer[widget]"


def test_causal_critic_freezes_its_first_layers_and_keeps_them_frozen_when_loaded(tmp_path, local_model):
    from polyturn.models.actor import load_base
    from polyturn.models.causal_critic import CausalCriticConfig

    model, tok, _ = load_base("local", str(local_model))
    n = len(model.model.layers)
    critic = CausalCritic(model=model, tokenizer=tok, config=CausalCriticConfig(param="head", freeze_layers=n))
    trainable = {k for k, p in critic.named_parameters() if p.requires_grad}
    assert trainable and all(not k.startswith("model.model.layers.") and "embed" not in k for k in trainable)
    critic.scores(INPUTS).sum().backward()  # the head and the final norm still learn
    assert critic.head.weight.grad is not None and critic.model.model.layers[0].mlp.up_proj.weight.grad is None
    critic.save_pretrained(tmp_path / "c")
    loaded = load_action_critic(tmp_path / "c")
    assert {k for k, p in loaded.named_parameters() if p.requires_grad} == trainable
    with pytest.raises(ValueError, match="decoder layers"):
        CausalCritic(model=model, tokenizer=tok, config=CausalCriticConfig(param="head", freeze_layers=n + 1))
