"""Refusals that can be learned, on CustomerService: refusal preference pairs (``ppo.refusal_pairs``) built from one
state and trained by DPO beside rft, best-of-n ranked by the cost critics (``rollout.best_of_rank: cost``), their
config errors, two-iteration runs with each, and ``benchmarks/refusals.py --quick``."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from polyturn.acting.episodes import generate_demos, run_episode
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.config import ConfigError, load_config
from polyturn.envs.actions import ToolCall, parse_action
from polyturn.envs.customer_service.customer import is_refusal
from polyturn.envs.customer_service.env import CustomerServiceEnv
from polyturn.envs.customer_service.expert import (CustomerServiceExpert, NoiseConfig, contrast_actions,
                                                  refusal_actions)
from polyturn.rollout.best_of import PrivilegedCriticError, deployable_scorer, pick_best
from polyturn.rollout.candidates import action_text, turn_context
from polyturn.train.constraints import candidate_scorer
from polyturn.train.critics import state_input
from polyturn.train.batch import MicroStats, common_prefix
from polyturn.train.logger import read_metrics
from polyturn.train.pairs import CandidatePair, pair_batch, pair_micro_batches, summed_logprobs
from polyturn.train.refusals import (RefusalTerm, allowed_states, contrast_pairs, fork, forbidden_starts,
                                    forbidden_states, refusal_pairs, start_metrics)
from polyturn.train.trainer import Trainer, check_run
from tests.conftest import StepsReporter
from tests.train.conftest import CFG

CS = "polyturn/CustomerService-v0"
PAIRS = "ppo.refusal_pairs={weight: 1.0}"
RFT = ("ppo.algo=rft", "critic.kind=none", "critic.group_size=2")
BY_COST = ("constraints.limits={cost/violation: 0.05}", "constraints.critic.kind=separate", "rollout.best_of=2",
           "rollout.best_of_rank=cost")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cs_demos(tmp_path_factory) -> Path:
    """16 noisy-expert CustomerService demonstrations."""
    path = tmp_path_factory.mktemp("cs_demos") / "demos.jsonl"
    write_jsonl(path, generate_demos(CS, episodes=16, noise=0.3, seed=0))
    return path


@pytest.fixture(scope="module")
def forbidden_records() -> list[dict]:
    """Four forbidden requests (training seeds): two refused by the exact expert, two carried out first (the
    expert's ``ignore_policy`` mistake: the confirmation, the write the backend refuses, then the refusal)."""
    env = CustomerServiceEnv()
    try:
        seeds = [s for s in range(300) if env.reset(seed=s)[1] and env.goal.forbidden][:4]
        exact = [run_episode(env, CustomerServiceExpert(env, seed=0), seed=s) for s in seeds[:2]]
        tried = [run_episode(env, CustomerServiceExpert(env, noise=NoiseConfig(ignore_policy=1.0), seed=0), seed=s)
                 for s in seeds[2:]]
    finally:
        env.close()
    return exact + tried


@pytest.fixture(scope="module")
def allowed_records() -> list[dict]:
    """Two allowed requests (a return and a cancellation) carried out by the exact expert: each passes two states the
    env marks allowed (the yes question, then the write)."""
    env = CustomerServiceEnv()
    try:
        seeds = [next(s for s in range(300) if env.reset(seed=s)[1] is not None and env.goal.case == case)
                 for case in ("return", "cancel")]
        return [run_episode(env, CustomerServiceExpert(env, seed=0), seed=s) for s in seeds]
    finally:
        env.close()


def cs_cfg(out: Path, demos: Path, *extra: str):
    """configs/test_tiny.yaml on CustomerService, two RL iterations (mixed, then PPO) after BC; actions up to 96
    tokens (the expert's refusals and writes fit)."""
    return load_config(CFG, [f"run.out_dir={out}", f"bc.demos={demos}", f"env.id={CS}", "env.eval_episodes=2",
                             "curriculum.warmup_iters=0", "rollout.max_action_tokens=96", *extra])


def prefixes(tr: Trainer, records: list[dict]) -> list[dict]:
    """Tasks that replay ``records`` whole (their actions forced)."""
    return [{"seed": r["seed"], "prefix": [tr.actor.encode(t["action"]) + [tr.actor.stop_id] for t in r["turns"]]}
            for r in records]


def replayed(tr: Trainer, records: list[dict]):
    episodes = tr.collector.collect(prefixes(tr, records), temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert [ep.success for ep in episodes] == [r["success"] for r in records]  # the same episodes, replayed
    return episodes


# ---- the pairs -------------------------------------------------------------------------------------------------------
def test_pairs_come_from_one_state_a_refusal_against_the_forbidden_write(tmp_path, cs_demos, forbidden_records):
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS))
    episodes = replayed(tr, forbidden_records)
    pairs, kinds = refusal_pairs(episodes, actor=tr.actor, settings=tr.settings, hook=refusal_actions,
                                 expert_options={})
    states = forbidden_states(episodes)
    # The exact expert refuses at its first forbidden state; the mistaken one asks for a yes, writes, then refuses.
    assert [len([s for s in states if s[0] == i]) for i in range(4)] == [1, 1, 3, 3]
    assert len(pairs) == len(states) and kinds.count("sampled") == 2  # the two writes the episodes made
    states_by_turn = {(i, t): facts for i, t, facts in states}
    # Unconfirmed: each exact expert's refusal, each mistaken expert's question for a yes (the write, then the
    # refusal, come after the customer's yes).
    assert [facts["confirmed"] for _, _, facts in states] == [False, False, False, True, True, False, True, True]
    # Before the yes: the decision (each exact expert's refusal state, each mistaken one's question for a yes).
    assert [kind == "decision" for kind in kinds] == [not facts["confirmed"] for _, _, facts in states]
    for pr, kind, (i, t, _) in zip(pairs, kinds, states):
        took = kind == "sampled"
        ep = episodes[i]
        chosen, rejected = pr.segments()
        context = turn_context(ep, t)
        assert chosen.ids[: len(context)] == rejected.ids[: len(context)] == context  # one state, two turns
        assert chosen.action_mask == [0] * len(context) + [1] * len(pr.chosen.ids)
        refusal = parse_action(action_text(tr.actor, pr.chosen))
        assert isinstance(refusal, ToolCall) and refusal.tool == "reply" and is_refusal(refusal.args["text"])
        step = parse_action(action_text(tr.actor, pr.rejected))
        confirmed = states_by_turn[i, t]["confirmed"]
        if not confirmed:  # before the yes: the question for one, as the expert writes it (never the policy's)
            assert not took and isinstance(step, ToolCall) and step.tool == "reply"
            assert step.args["text"].endswith("Shall I proceed?")
            continue
        assert isinstance(step, ToolCall) and step.tool in ("refund", "exchange", "cancel_order")
        if took:  # the write the policy sampled: its own ids and log-probs, the step the backend refused
            assert pr.rejected.ids == ep.turns[t].action_ids and pr.rejected.logprobs == ep.turns[t].logprobs
            assert ep.turns[t].cost_terms["cost/violation"] == 1.0
        else:  # the write the request asks for, as the expert writes it
            assert ep.turns[t].action != action_text(tr.actor, pr.rejected)
    # The refusal is the expert's own at that state: the exact expert played it there.
    i, t, _ = states[0]
    assert action_text(tr.actor, pairs[0].chosen) == episodes[i].turns[t].action
    tr.close_envs()


def test_a_dpo_step_on_the_pairs_raises_the_refusal_against_the_write(tmp_path, cs_demos, forbidden_records):
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, "actor.lr=1e-3", "ppo.epochs=3"))
    episodes = replayed(tr, forbidden_records)
    tr.policy.set_reference()  # the frozen reference (the BC policy, here the actor as built)
    metrics: dict[str, float] = {}
    rep = StepsReporter()
    term = RefusalTerm.build(tr.policy, episodes, temperature=1.0, metrics=metrics, progress=rep.sub)
    assert term is not None and metrics == {"refusal/states": 8.0, "refusal/pairs": 8.0, "refusal/sampled_writes": 2.0,
                                           "refusal/decisions": 4.0}
    assert rep.steps == [["refusal pairs", 16, 16]]  # each pair through the reference and the policy
    before = summed_logprobs(tr.actor, term.pairs, temperature=1.0, budget=None)
    assert torch.allclose(before, term.ref, atol=1e-4)  # the policy is still the reference: every margin is 0
    empty = torch.zeros(0, 1)
    first = tr.policy.update_actor(tr.algo, [], empty, empty, empty, temperature=1.0, ent_coef=0.0, w_bc=0.0,
                                   w_rl=1.0, beside=term)
    assert first["refusal/dpo_loss"] < 0.6932 and "losses/actor_loss" not in first  # the pairs' term alone
    after = summed_logprobs(tr.actor, term.pairs, temperature=1.0, budget=None)
    gap_before, gap_after = before[:, 0] - before[:, 1], after[:, 0] - after[:, 1]
    assert float((gap_after - gap_before).mean()) > 1.0  # the refusal gained on the write, by nats
    assert (after[:, 0] > before[:, 0]).all()  # and its own log-prob rose at every state (the NLL term)
    logged = term.after()
    assert rep.steps[-1] == ["refusal pairs after", 8, 8]
    assert logged["refusal/gap_after"] == pytest.approx(float(gap_after.mean()), rel=1e-4)
    assert logged["refusal/gap_before"] == pytest.approx(float(gap_before.mean()), rel=1e-4)
    tr.close_envs()


def test_fork_pairs_push_down_only_the_writes_first_token_off_the_refusal(tmp_path, cs_demos, forbidden_records):
    """``rejected: fork``: each rejected turn is the full pair's write cut after its first token that differs from the
    refusal; a DPO step then lowers that token's log-prob at the fork, and the write's tokens after it are not in
    the loss."""
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, "ppo.refusal_pairs.rejected=fork", "actor.lr=1e-3"))
    episodes = replayed(tr, forbidden_records)
    whole, _ = refusal_pairs(episodes, actor=tr.actor, settings=tr.settings, hook=refusal_actions, expert_options={})
    cut, _ = refusal_pairs(episodes, actor=tr.actor, settings=tr.settings, hook=refusal_actions, expert_options={},
                           rejected_part="fork")
    assert len(cut) == len(whole) == 8
    for w, c in zip(whole, cut, strict=True):
        k = fork(w.chosen.ids, w.rejected.ids)
        assert c.chosen.ids == w.chosen.ids and c.rejected.ids == w.rejected.ids[: k + 1]
        assert c.rejected.ids[:k] == w.chosen.ids[:k] and c.rejected.ids[k] != w.chosen.ids[k]
    assert fork([1, 2, 3], [1, 2, 4, 5]) == 2 and fork([1, 2, 3], [7]) == 0 and fork([1, 2, 3], [1, 2]) is None
    tr.policy.set_reference()
    term = RefusalTerm.build(tr.policy, episodes, temperature=1.0, metrics={})
    assert [p.rejected.ids for p in term.pairs] == [p.rejected.ids for p in cut]
    before = summed_logprobs(tr.actor, term.pairs, temperature=1.0, budget=None)
    empty = torch.zeros(0, 1)
    tr.policy.update_actor(tr.algo, [], empty, empty, empty, temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0,
                           beside=term)
    after = summed_logprobs(tr.actor, term.pairs, temperature=1.0, budget=None)
    # the fork token's log-prob (the shared prefix is the refusal's own: the chosen side holds it too) fell
    assert float((after[:, 1] - before[:, 1]).mean()) < 0
    assert float(((after[:, 0] - after[:, 1]) - (before[:, 0] - before[:, 1])).mean()) > 0.1
    # The choice at the fork, by hand: the next-token distribution after the shared prefix, the refusal's token
    # against the write's (the fail-first check: the whole-turn choice differs from it).
    choices = []
    with torch.no_grad():
        for pr in term.pairs:
            k = len(pr.rejected.ids) - 1
            logits = tr.actor.model(input_ids=torch.tensor([pr.context + pr.chosen.ids[:k]])).logits[0, -1]
            lp = logits.float().log_softmax(-1)
            choices.append(torch.sigmoid(lp[pr.chosen.ids[k]] - lp[pr.rejected.ids[k]]))
    logged = term.after()
    assert logged["refusal/fork_choice_after"] == pytest.approx(float(torch.stack(choices).mean()), abs=1e-5)
    assert abs(logged["refusal/fork_choice_after"] - logged["refusal/choice_after"]) > 1e-3
    assert logged["refusal/fork_choice_after"] > logged["refusal/fork_choice_before"]
    tr.close_envs()


def test_at_the_fork_dpo_reads_the_chosen_turn_through_the_fork_token_only(tmp_path, cs_demos, forbidden_records):
    """``rejected: fork``: DPO is the decision at the fork alone. The chosen turn's tokens after the fork (a refusal
    already begun) are not in it: with the policy away from its reference, the term (nll 0) and its margin are the
    same with those tokens cut off the chosen turns, and differ when the rejected turns are whole."""
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, "ppo.refusal_pairs={weight: 1.0, nll: 0.0, rejected: fork}"))
    episodes = replayed(tr, forbidden_records)
    tr.policy.set_reference()
    with torch.no_grad():  # away from the reference, so that every token's log-ratio counts
        g = torch.Generator().manual_seed(0)
        for p in tr.actor.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    term = RefusalTerm.build(tr.policy, episodes, temperature=1.0, metrics={})
    assert term is not None and all(len(pr.chosen.ids) > len(pr.rejected.ids) for pr in term.pairs)

    def through_fork(pr: CandidatePair) -> CandidatePair:
        n = len(pr.rejected.ids)
        return CandidatePair(pr.context, dataclasses.replace(pr.chosen, ids=pr.chosen.ids[:n],
                                                             logprobs=pr.chosen.logprobs[:n]), pr.rejected)

    def dpo(t: RefusalTerm) -> dict[str, float]:
        tr.policy.py_rng.seed(0)  # the same pairs drawn
        acc = MicroStats()
        with torch.no_grad():
            list(t(acc))
        return acc.result()

    cut = RefusalTerm(term.cfg, tr.policy, [through_fork(pr) for pr in term.pairs], temperature=1.0)
    a, b = dpo(term), dpo(cut)
    assert a["refusal/dpo_loss"] == pytest.approx(b["refusal/dpo_loss"], rel=1e-5)
    assert a["refusal/margin"] == pytest.approx(b["refusal/margin"], rel=1e-4, abs=1e-5)
    assert abs(a["refusal/margin"]) > 1e-3  # not trivially equal: the policy is away from its reference
    whole, _ = refusal_pairs(episodes, actor=tr.actor, settings=tr.settings, hook=refusal_actions, expert_options={})
    turn = RefusalTerm(term.cfg.model_copy(update={"rejected": "turn"}), tr.policy, whole, temperature=1.0)
    assert abs(dpo(turn)["refusal/margin"] - a["refusal/margin"]) > 1e-3
    # nll_through: fork: the NLL too reads the chosen turns through the fork token only (the same with their tails
    # cut off); the whole turns' NLL differs.
    fork_nll = term.cfg.model_copy(update={"nll": 1.0, "nll_through": "fork"})
    a = dpo(RefusalTerm(fork_nll, tr.policy, term.pairs, temperature=1.0))
    b = dpo(RefusalTerm(fork_nll, tr.policy, cut.pairs, temperature=1.0))
    c = dpo(RefusalTerm(fork_nll.model_copy(update={"nll_through": "turn"}), tr.policy, term.pairs, temperature=1.0))
    assert a["refusal/nll"] == pytest.approx(b["refusal/nll"], rel=1e-5)
    assert abs(a["refusal/nll"] - c["refusal/nll"]) > 1e-3
    tr.close_envs()


def test_with_shared_prefix_each_pair_runs_its_context_once_to_the_same_logprobs_and_gradients(
        tmp_path, cs_demos, forbidden_records):
    """``actor.shared_prefix``: one pair a micro-batch, its two rows' common prefix (the whole context, and the
    refusal's tokens before the fork) run once; the summed log-probs, the reference's, and the term's gradients are
    those of the pairs run whole."""
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, "ppo.refusal_pairs.rejected=fork", "actor.shared_prefix=true"))
    episodes = replayed(tr, forbidden_records)
    tr.policy.set_reference()
    term = RefusalTerm.build(tr.policy, episodes, temperature=1.0, metrics={})
    assert term is not None and term.share
    pairs = term.pairs
    micro = pair_micro_batches(pairs, 64, share_context=True)
    assert all(len(m) == 1 for m in micro) and sorted(m[0] for m in micro) == list(range(len(pairs)))
    for (i,) in micro:
        batch = pair_batch(pairs, [i], tr.actor, share_context=True)
        assert batch.shared == common_prefix([list(s.ids) for s in pairs[i].segments()]) >= len(pairs[i].context)
    whole = summed_logprobs(tr.actor, pairs, temperature=1.0, budget=None, chosen_prefix=True)
    assert torch.allclose(term.before, whole, rtol=1e-5, atol=1e-4)
    assert torch.allclose(term.ref, whole, rtol=1e-5, atol=1e-4)  # the reference is still the policy

    params = tr.actor.trainable_parameters()

    def grads(share: bool) -> list[torch.Tensor]:
        term.share = share
        tr.policy.py_rng.seed(0)  # the same pairs drawn
        for p in params:
            p.grad = None
        torch.stack(list(term(MicroStats()))).sum().backward()
        return [p.grad.clone() for p in params]

    for a, b in zip(grads(True), grads(False), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))
    tr.close_envs()


def test_contrast_pairs_prefer_the_experts_step_over_a_refusal_where_the_request_is_allowed(
        tmp_path, cs_demos, forbidden_records, allowed_records):
    """``contrast: N``: at the states the env marks allowed, the expert's step (chosen) against a refusal (rejected),
    up to N of them beside the refusal pairs; a step on them raises the expert's step against the refusal there."""
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, "ppo.refusal_pairs.contrast=3"))
    episodes = replayed(tr, forbidden_records + allowed_records)
    states = allowed_states(episodes)
    assert [i for i, _, _ in states] == [4, 4, 5, 5]  # two states in each allowed episode, none in the forbidden ones
    pairs = contrast_pairs(episodes, actor=tr.actor, settings=tr.settings, hook=contrast_actions, expert_options={})
    for pr, (i, t, _) in zip(pairs, states, strict=True):
        assert action_text(tr.actor, pr.chosen) == episodes[i].turns[t].action  # what the expert did there
        refusal = parse_action(action_text(tr.actor, pr.rejected))
        assert isinstance(refusal, ToolCall) and refusal.tool == "reply" and is_refusal(refusal.args["text"])
    tr.policy.set_reference()
    metrics: dict[str, float] = {}
    term = RefusalTerm.build(tr.policy, episodes, temperature=1.0, metrics=metrics)
    assert term is not None and metrics["refusal/pairs"] == 8 and metrics["refusal/contrast_states"] == 4
    assert metrics["refusal/contrast_pairs"] == 3 and len(term.pairs) == 11 and term.n_refusals == 8
    assert {"refusal/gap_after", "refusal/contrast_gap_after"} <= set(term.after())
    tr.close_envs()

    # Contrast pairs alone (no forbidden state met): the term still runs, and its step prefers the expert's step.
    tr = Trainer(cs_cfg(tmp_path / "alone", cs_demos, *RFT, PAIRS, "ppo.refusal_pairs.contrast=4", "actor.lr=1e-3",
                        "ppo.epochs=3"))
    tr.policy.set_reference()
    metrics = {}
    term = RefusalTerm.build(tr.policy, replayed(tr, allowed_records), temperature=1.0, metrics=metrics)
    assert term is not None and term.n_refusals == 0 and metrics["refusal/pairs"] == 0
    empty = torch.zeros(0, 1)
    tr.policy.update_actor(tr.algo, [], empty, empty, empty, temperature=1.0, ent_coef=0.0, w_bc=0.0, w_rl=1.0,
                           beside=term)
    logged = term.after()
    assert set(logged) == {"refusal/contrast_gap_before", "refusal/contrast_gap_after"}
    assert logged["refusal/contrast_gap_after"] > logged["refusal/contrast_gap_before"] + 1.0
    tr.close_envs()


def test_the_first_step_starts_from_the_reference(tmp_path, cs_demos, forbidden_records):
    """One step, one minibatch: its DPO loss is measured at the reference itself, log 2, and no pair is ranked yet."""
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, "ppo.epochs=1"))
    episodes = replayed(tr, forbidden_records)
    tr.policy.set_reference()
    term = RefusalTerm.build(tr.policy, episodes, temperature=1.0, metrics={})
    empty = torch.zeros(0, 1)
    out = tr.policy.update_actor(tr.algo, [], empty, empty, empty, temperature=1.0, ent_coef=0.0, w_bc=0.0,
                                 w_rl=1.0, beside=term)
    assert out["refusal/dpo_loss"] == pytest.approx(0.693147, abs=1e-4) and out["refusal/accuracy"] == 0.0
    tr.close_envs()


def test_max_pairs_keeps_the_kind_first_names_first(tmp_path, cs_demos, forbidden_records):
    """Of the 8 pairs (2 sampled writes, 4 decisions before the yes, 2 hook writes), max_pairs 3 keeps both sampled
    writes with first: sampled, and three decisions with first: decision."""
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, "ppo.refusal_pairs.max_pairs=3"))
    episodes = replayed(tr, forbidden_records)
    tr.policy.set_reference()
    for first, want in (("sampled", (2.0, "sampled_writes")), ("decision", (3.0, "decisions"))):
        tr.policy.cfg.ppo.refusal_pairs.first = first
        metrics: dict[str, float] = {}
        term = RefusalTerm.build(tr.policy, episodes, temperature=1.0, metrics=metrics)
        assert term is not None and metrics["refusal/pairs"] == 3.0 and metrics["refusal/states"] == 8.0
        assert metrics[f"refusal/{want[1]}"] == want[0], first
    with pytest.raises(ValueError, match="first"):
        cs_cfg(tmp_path / "bad", cs_demos, *RFT, PAIRS, "ppo.refusal_pairs.first=writes")
    tr.close_envs()


@pytest.mark.slow
def test_two_iterations_of_rft_with_refusal_pairs(tmp_path, cs_demos, forbidden_records, monkeypatch):
    """Every RL task replays an expert up to its first forbidden state; from there the policy samples."""
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, "ppo.refusal_pairs.max_pairs=4"))
    tasks = forbidden_starts(forbidden_records, tr.envs[0], actor=tr.actor, settings=tr.settings)  # up to the state
    monkeypatch.setattr(tr, "next_tasks", lambda n, progress: [t for t in tasks for _ in range(2)][:n])
    before = {k: v.clone() for k, v in tr.actor.model.state_dict().items()}
    tr.run()
    rl = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["phase"] in ("mixed", "ppo")]
    assert [r["phase"] for r in rl] == ["mixed", "ppo"]
    for r in rl:
        assert r["refusal/states"] >= 8 and r["refusal/pairs"] == 4  # every episode starts at a forbidden state
        for k in ("dpo_loss", "accuracy", "margin", "nll", "logp_before", "logp_after", "gap_before", "gap_after",
                  "choice_before", "choice_after"):
            assert f"refusal/{k}" in r, k
    assert (tmp_path / "ckpt-final" / "ref_actor").is_dir()  # the DPO reference is kept for resume
    assert any(not torch.equal(before[k], v) for k, v in tr.actor.model.state_dict().items())


def test_demo_starts_begin_at_the_demonstrations_forbidden_states(tmp_path, cs_demos, forbidden_records):
    """ppo.refusal_pairs.demo_starts: the last groups of each iteration's tasks replay a demonstration up to its first
    forbidden state, and the policy samples from there, so the pairs come however rarely it gets there itself."""
    demos = tmp_path / "demos.jsonl"
    write_jsonl(demos, [*forbidden_records, *read_jsonl(cs_demos)])
    tr = Trainer(cs_cfg(tmp_path / "run", demos, *RFT, PAIRS, "ppo.refusal_pairs.demo_starts=3"))
    want = {r["seed"] for r in forbidden_records}
    assert want <= {s["seed"] for s in tr.refusal_starts.starts}  # every forbidden record reaches such a state
    tasks = tr.next_tasks(8, 0.0)
    assert len(tasks) == 8 and not any("prefix" in t for t in tasks[:2])
    assert all(t["refusal_start"] for t in tasks[2:]) and [t["seed"] for t in tasks[2::2]] == [t["seed"] for t in
                                                                                                  tasks[3::2]]
    episodes = tr.collector.collect(tasks, temperature=1.0, generator=torch.Generator().manual_seed(0))
    for task, ep in zip(tasks[2:], episodes[2:], strict=True):  # the prefix's last step marks the state forbidden
        assert [t.forced for t in ep.turns[: len(task["prefix"])]] == [True] * len(task["prefix"])
        assert "forbidden" in ep.turns[len(task["prefix"]) - 1].info
    assert {i for i, _, _ in forbidden_states(episodes)} == set(range(2, 8))
    assert start_metrics(tasks, episodes)["refusal/demo_starts"] == 6.0

    plain = tmp_path / "plain.jsonl"  # no demonstration reaches a forbidden state: said, with the fix
    write_jsonl(plain, [r for r in read_jsonl(cs_demos) if "refuses politely" not in r["privileged"]][:4])
    with pytest.raises(ValueError, match="demo_starts = 3 needs demonstrations that reach a forbidden state.*"
                                         "demo_starts=0"):
        Trainer(cs_cfg(tmp_path / "run2", plain, *RFT, PAIRS, "ppo.refusal_pairs.demo_starts=3"))


# ---- best-of-n by the cost critics -----------------------------------------------------------------------------------
def test_best_of_by_cost_picks_the_candidate_with_the_lower_priced_cost(tmp_path, cs_demos, forbidden_records):
    tr = Trainer(cs_cfg(tmp_path, cs_demos, *RFT, *BY_COST))
    episodes = replayed(tr, forbidden_records[2:])  # the mistaken expert: its write was refused (a violation)
    i, t, forbidden = forbidden_states(episodes)[1]
    refusal, write = refusal_actions(forbidden, {})
    state = state_input(episodes[i], t)
    inputs = [dataclasses.replace(state, action=a) for a in (write, refusal)]
    # Train the violation critic's Q briefly on what the two would cost: the write 1 (refused), the refusal 0.
    cost = tr.policy.constraints.critics["cost/violation"].critic
    opt = torch.optim.Adam(cost.parameters(), lr=3e-3)
    for _ in range(60):
        cost.train()
        loss = ((cost.q_values(inputs) - torch.tensor([1.0, 0.0])) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    scorer = candidate_scorer(tr.cfg, tr.critic, tr.policy.constraints)
    q = tr.policy.constraints.critics["cost/violation"].scorer()(inputs)
    assert q[0] > 0.8 and q[1] < 0.2
    tr.state.multipliers["cost/violation"] = 2.0
    scores = scorer(inputs)
    assert scores == pytest.approx([-2.0 * q[0], -2.0 * q[1]], abs=1e-5)  # no reward critic: -lambda Q_cost
    assert pick_best(scores) == 1  # the refusal
    tr.state.multipliers["cost/violation"] = 0.0  # a constraint that does not bind: every candidate ties,
    assert pick_best(scorer(inputs)) == 0  # the first one sampled is played (plain sampling)
    tr.close_envs()


@pytest.mark.slow
def test_two_iterations_with_best_of_by_cost(tmp_path, cs_demos):
    out = tmp_path / "run"
    tr = Trainer(cs_cfg(out, cs_demos, "critic.q=true", *BY_COST, "constraints.init=1.0",
                        "curriculum.epsilon={start: 0.0, end: 0.0}", "env.kwargs={max_turns: 6}"))
    assert tr.collector.best_of == 1 and tr.train_collector.best_of == 2  # evaluation samples plainly
    tr.run()
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] in ("mixed", "ppo")]
    assert len(rl) == 2
    for r in rl:  # every turn of the batch chose between 2 candidates scored by the critics
        assert r["constraint/best_of_candidates"] == pytest.approx(2 * r["charts/turns_mean"] * r["charts/episodes"])
        assert "constraint/cost/violation/best_of_q" in r
    # With a reward critic that has a Q head, the score is Q_reward - lambda Q_cost.
    ep = tr.collector.collect([{"seed": 5}], temperature=1.0, generator=torch.Generator().manual_seed(0))[0]
    inputs = [state_input(ep, t) for t in range(len(ep.turns))]
    lam = tr.state.multipliers["cost/violation"]
    want = [r - lam * c for r, c in zip(tr.critic.scorer()(inputs),
                                        tr.policy.constraints.critics["cost/violation"].scorer()(inputs))]
    assert candidate_scorer(tr.cfg, tr.critic, tr.policy.constraints)(inputs) == pytest.approx(want, abs=1e-5)
    # A cost critic that reads privileged text is refused where that text does not exist, as any such critic is.
    with pytest.raises(PrivilegedCriticError, match="privileged"):
        deployable_scorer(str(out / "ckpt-final" / "costs" / "cost_violation"), oracle=False)
    tr.close_envs()


# ---- config errors -----------------------------------------------------------------------------------------------------
def test_settings_that_cannot_run_are_refused_with_the_field_and_the_fix(tmp_path, cs_demos, monkeypatch):
    with pytest.raises(ConfigError, match="ppo.refusal_pairs.*turn_dpo.*ppo.algo=rft"):
        cs_cfg(tmp_path, cs_demos, PAIRS, "ppo.algo=turn_dpo", "critic.kind=action")
    with pytest.raises(ConfigError, match="ppo.refusal_pairs.weight"):
        cs_cfg(tmp_path, cs_demos, "ppo.refusal_pairs={weight: 0}")
    with pytest.raises(ConfigError, match="nll_through = fork.*rejected = 'turn'.*rejected=fork"):
        cs_cfg(tmp_path, cs_demos, "ppo.refusal_pairs={nll_through: fork}")
    with pytest.raises(ConfigError, match="rollout.best_of_rank = 'cost'.*rollout.best_of to 2"):
        cs_cfg(tmp_path, cs_demos, "rollout.best_of_rank=cost")
    with pytest.raises(ValueError, match="ppo.refusal_pairs needs an env.*SQLAnalyst"):
        check_run(cs_cfg(tmp_path, cs_demos, PAIRS, "env.id=polyturn/SQLAnalyst-v0"))
    import polyturn.train.refusals as refusals_module
    spec = refusals_module.spec_or_none(CS)
    with monkeypatch.context() as m:  # an env that marks forbidden states but not allowed ones
        m.setattr(refusals_module, "spec_or_none", lambda _: dataclasses.replace(spec, contrasts=None))
        with pytest.raises(ValueError, match="ppo.refusal_pairs.contrast = 2 needs.*contrasts hook.*contrast=0"):
            check_run(cs_cfg(tmp_path, cs_demos, PAIRS, "ppo.refusal_pairs.contrast=2"))
    with pytest.raises(ValueError, match="ppo.refusal_pairs.*--nproc 2"):
        check_run(cs_cfg(tmp_path, cs_demos, PAIRS), world_size=2)
    with pytest.raises(ValueError, match="got no constraints.*constraints.limits"):
        check_run(cs_cfg(tmp_path, cs_demos, "rollout.best_of=2", "rollout.best_of_rank=cost"))
    with pytest.raises(ValueError, match="kind 'none'.*constraints.critic.kind=separate"):
        check_run(cs_cfg(tmp_path, cs_demos, *RFT, *BY_COST, "constraints.critic.kind=none"))
    with pytest.raises(ValueError, match="rollout.workers = 1.*rollout.workers=0"):
        check_run(cs_cfg(tmp_path, cs_demos, *BY_COST, "rollout.workers=1"))
    with pytest.raises(ValueError, match="critic.kind=action"):  # best-of by the action critic still needs one
        check_run(cs_cfg(tmp_path, cs_demos, "rollout.best_of=2"))
    check_run(cs_cfg(tmp_path, cs_demos, *RFT, PAIRS, *BY_COST))  # both beside rft: fine
    assert not (tmp_path / "ckpt-bc").exists()  # refused before anything was made


# ---- the benchmark -----------------------------------------------------------------------------------------------------
def run_benchmark(script: str, monkeypatch, args: list[str]):
    """Load benchmarks/SCRIPT as a module and run its main(ARGS) (it must return 0); the module, for its helpers.
    The torch thread count it may set is put back."""
    spec = importlib.util.spec_from_file_location(f"bench_{script}", ROOT / "benchmarks" / f"{script}.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        assert bench.main(args) == 0
    finally:
        torch.set_num_threads(threads)
    return bench


@pytest.mark.slow
def test_refusals_benchmark_quick_runs_each_arm(tmp_path, monkeypatch, capsys):
    run_benchmark("refusals", monkeypatch, ["--quick", "--out", str(tmp_path), "--rejected", "fork", "--contrast", "4"])
    out = capsys.readouterr().out
    for arm in ("rft", "rft + pairs", "rft + best-of by cost", "rft + pairs + best-of by cost"):
        assert f"| {arm} |" in out, out
    assert "refused forbidden" in out


@pytest.mark.slow
def test_the_refusal_fork_benchmark_reads_both_kinds_of_states(tmp_path, monkeypatch, capsys):
    """benchmarks/refusal_fork.py --quick: P(refuse) at the held-out forbidden and allowed states of a tiny BC."""
    out = tmp_path / "fork.json"
    bench = run_benchmark("refusal_fork", monkeypatch, ["--quick", "--out", str(tmp_path), "--json", str(out)])
    choices = next(iter(json.loads(out.read_text())["choices"].values()))
    assert choices["forbidden"] and choices["allowed"]  # 12 held-out tasks meet both kinds of states
    assert all(0.0 < p < 1.0 for kind in choices.values() for p in kind)
    assert "| AUC |" in capsys.readouterr().out
    # The AUC by hand: forbidden [0.9, 0.6] over allowed [0.5, 0.7, 0.1] wins 3 + 2 of 6 comparisons.
    row = bench.summary({"forbidden": [0.9, 0.6], "allowed": [0.5, 0.7, 0.1]})
    assert row["AUC"] == pytest.approx(5 / 6) and row["refused allowed"] == pytest.approx(1 / 3)
    assert row["P(refuse) forbidden"] == pytest.approx(0.75)
    with pytest.raises(SystemExit) as exit_:  # nothing to measure: argparse's usage error, no traceback
        bench.main([])
    assert exit_.value.code == 2
