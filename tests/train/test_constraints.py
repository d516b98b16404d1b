"""Constrained RL (config ``constraints``) on CustomerService: the config checks, the multipliers' steps as logged,
constrained PPO and rft runs, rft never imitating an episode over a limit, an exact resume, and constraints that
never bind changing no number of the run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from polyturn.acting.jsonl import read_jsonl
from polyturn.config import load_config
from polyturn.train.logger import read_metrics
from polyturn.train.state import RunState
from polyturn.train.trainer import Trainer
from tests.train.conftest import CFG, assert_same_weights, stopped_copy

CS = "polyturn/CustomerService-v0"
LIMITS = "constraints.limits={cost/violation: 0.1, cost/error_response: 4.0}"
RL = ("phase", "warmup", "mixed", "ppo")


@pytest.fixture(scope="module")
def cs_demos(tmp_path_factory) -> Path:
    """16 noisy-expert CustomerService demonstrations."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl

    path = tmp_path_factory.mktemp("cs_demos") / "demos.jsonl"
    write_jsonl(path, generate_demos(CS, episodes=16, noise=0.3, seed=0))
    return path


def cs_cfg(out: Path, demos: Path, *extra: str):
    """configs/test_tiny.yaml on CustomerService, two RL iterations (mixed, then PPO) after BC; episodes of at most 6
    turns (the tiny actor's episodes run to the limit, and every cost term still occurs in 6)."""
    return load_config(CFG, [f"run.out_dir={out}", f"bc.demos={demos}", f"env.id={CS}", "env.eval_episodes=2",
                             "env.kwargs={max_turns: 6}", "curriculum.warmup_iters=0", *extra])


def rl_records(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] in RL]


# ---- checks before anything is made ------------------------------------------------------------------------------
def test_an_unknown_cost_term_is_refused_with_the_envs_cost_terms(tmp_path, cs_demos):
    with pytest.raises(ValueError, match=r"\['cost/violations'\].*cost/violation, cost/error_response"):
        Trainer(cs_cfg(tmp_path / "run", cs_demos, "constraints.limits={cost/violations: 0.1}"))
    assert not (tmp_path / "run").exists()  # refused before the run made anything
    with pytest.raises(ValueError, match="its cost terms: cost/sandbox"):
        Trainer(cs_cfg(tmp_path / "sql", cs_demos, "env.id=polyturn/SQLAnalyst-v0", LIMITS))
    with pytest.raises(ValueError, match="its cost terms: none"):
        Trainer(cs_cfg(tmp_path / "tq", cs_demos, "env.id=polyturn/TwentyQuestions-v0", LIMITS))


def test_updates_and_cost_critics_that_cannot_run_constrained_are_refused(tmp_path, cs_demos):
    with pytest.raises(ValueError, match="constraints.critic.kind = 'none'.*critic.kind = 'separate'"):
        Trainer(cs_cfg(tmp_path / "a", cs_demos, LIMITS, "constraints.critic.kind=none"))
    with pytest.raises(ValueError, match="ppo.algo = 'turn_dpo'"):
        Trainer(cs_cfg(tmp_path / "b", cs_demos, LIMITS, "ppo.algo=turn_dpo", "critic.kind=action",
                       "critic.group_size=2"))


# ---- runs ------------------------------------------------------------------------------------------------------------
def _multiplier_steps(records: list[dict], *, name: str, limit: float, lr: float, init: float, top: float) -> None:
    """Each iteration's logged multiplier is the last one stepped by that iteration's logged cost."""
    lam = init
    for r in records:
        pre = f"constraint/{name}/"
        lam = min(max(lam + lr * (r[pre + "cost"] - limit), 0.0), top)
        assert r[pre + "lambda"] == pytest.approx(lam, abs=1e-12), r["phase"]
        assert r[pre + "margin"] == pytest.approx(limit - r[pre + "cost"])


@pytest.mark.slow
def test_ppo_with_a_cost_critic_per_constraint(tmp_path, cs_demos):
    out = tmp_path / "ppo"
    Trainer(cs_cfg(out, cs_demos, LIMITS, "constraints.lr=0.5", "constraints.init=0.2", "constraints.max=3")).run()
    rl = rl_records(out)
    assert [r["phase"] for r in rl] == ["mixed", "ppo"]
    for name, limit in (("cost/violation", 0.1), ("cost/error_response", 4.0)):
        _multiplier_steps(rl, name=name, limit=limit, lr=0.5, init=0.2, top=3.0)
        for r in rl:  # the cost critic (separate, as critic.kind) reports how well it predicts the costs
            assert math.isfinite(r[f"constraint/{name}/explained_variance"])
            assert r[f"constraint/{name}/value_loss"] >= 0
    assert rl[-1]["constraint/cost/error_response/cost"] > 4.0  # a tiny actor answers with errors: the multiplier
    assert rl[-1]["constraint/cost/error_response/lambda"] > 0.2  # rose
    state = json.loads((out / "ckpt-final" / "trainer_state.json").read_text())
    assert state["multipliers"] == {n: rl[-1][f"constraint/{n}/lambda"] for n in ("cost/violation",
                                                                                   "cost/error_response")}
    for term in ("cost_violation", "cost_error_response"):  # each cost critic is saved beside the reward's
        assert (out / "ckpt-final" / "costs" / term / "critic").is_dir()
    episodes = read_jsonl(out / "eval_final.jsonl")
    assert episodes and all(set(t["cost_terms"]) == {"cost/violation", "cost/error_response"}
                            for ep in episodes for t in ep["turns"])


@pytest.mark.slow
def test_rft_with_group_relative_costs(tmp_path, cs_demos):
    out = tmp_path / "rft"
    Trainer(cs_cfg(out, cs_demos, LIMITS, "ppo.algo=rft", "critic.kind=none", "critic.group_size=2",
                   "constraints.lr=0.5")).run()
    rl = rl_records(out)
    assert [r["phase"] for r in rl] == ["mixed", "ppo"]
    _multiplier_steps(rl, name="cost/error_response", limit=4.0, lr=0.5, init=0.0, top=10.0)
    for r in rl:
        assert {"constraint/successes_dropped", "constraint/weight_mean", "rft/kept"} <= set(r)
        assert "constraint/cost/violation/explained_variance" not in r  # a group baseline has no values
    assert not (out / "ckpt-final" / "costs" / "cost_violation" / "critic").exists()


@pytest.mark.slow
def test_rft_never_imitates_an_episode_over_a_limit(tmp_path, cs_demos):
    """The noisy expert's demonstrations replayed through the run's collector (their actions forced): rft keeps the
    successes within the limit, each weighted by its priced cost, and drops the others."""
    out = tmp_path / "replay"
    tr = Trainer(cs_cfg(out, cs_demos, "constraints.limits={cost/error_response: 1.0}", "constraints.lr=0",
                        "constraints.init=0.25", "ppo.algo=rft", "critic.kind=none", "critic.group_size=2",
                        "rollout.max_action_tokens=96", "bc.epochs=0.01", "env.kwargs={max_turns: 14}"))
    actor = tr.actor
    demos = read_jsonl(cs_demos)
    tasks = [{"seed": d["seed"], "prefix": [actor.encode(t["action"]) + [actor.stop_id] for t in d["turns"]]}
             for d in demos]
    episodes = tr.collector.collect(tasks, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert [ep.success for ep in episodes] == [d["success"] for d in demos]  # the same episodes, replayed
    errors = [ep.costs["cost/error_response"] for ep in episodes]
    within = [i for i, ep in enumerate(episodes) if ep.success and errors[i] <= 1.0]
    over = [i for i, ep in enumerate(episodes) if ep.success and errors[i] > 1.0]
    assert within and over  # the demonstrations hold both kinds
    metrics = tr.learn(1, episodes, gen_s=1.0)  # iteration 1: the mixed phase, an actor step
    assert metrics["rft/kept"] == len(within)
    assert metrics["constraint/successes_dropped"] == len(over)
    assert metrics["constraint/weight_mean"] == pytest.approx(sum(1 - 0.25 * errors[i] for i in within) / len(within))
    tr.critic_update.finish()
    tr.close_envs()


@pytest.mark.slow
def test_resume_restores_the_multipliers_and_the_cost_critics_exactly(tmp_path, cs_demos):
    extra = (LIMITS, "constraints.lr=0.5", "curriculum.ppo_iters=2", "constraints.critic.privileged=false")
    straight = tmp_path / "straight"
    Trainer(cs_cfg(straight, cs_demos, *extra)).run()
    resumed = tmp_path / "resumed"
    stopped_copy(straight, resumed, at="ckpt-iter0002", later=("ckpt-iter0003", "ckpt-final"))
    tr = Trainer(cs_cfg(resumed, cs_demos, *extra), resume=True)
    saved = RunState.from_json(json.loads((straight / "ckpt-iter0002" / "trainer_state.json").read_text()))
    assert tr.state.iter == 2 and tr.state.multipliers == saved.multipliers and saved.multipliers
    tr.run()
    costs = ("costs/cost_violation/critic", "costs/cost_error_response/critic")
    assert_same_weights(straight / "ckpt-iter0003", resumed / "ckpt-iter0003", ("critic", *costs))
    a, b = rl_records(straight)[-1], rl_records(resumed)[-1]
    assert {k: v for k, v in a.items() if k.startswith("constraint/")} == \
           {k: v for k, v in b.items() if k.startswith("constraint/")}


@pytest.mark.slow
def test_constraints_that_never_bind_change_no_number(tmp_path, cs_demos):
    """Multipliers held at 0 (lr 0): the penalised advantage is the reward's, and building and training the cost
    critics draws from none of the run's RNG streams, so every other logged number is the unconstrained run's."""
    Trainer(cs_cfg(tmp_path / "plain", cs_demos)).run()
    Trainer(cs_cfg(tmp_path / "bound", cs_demos, LIMITS, "constraints.lr=0")).run()
    plain, bound = read_metrics(tmp_path / "plain" / "metrics.jsonl"), read_metrics(tmp_path / "bound" / "metrics.jsonl")
    assert len(plain) == len(bound)
    for p, b in zip(plain, bound):
        kept = {k: v for k, v in b.items() if not k.startswith("constraint/")}
        assert sorted(kept) == sorted(p)
        assert {k: v for k, v in kept.items() if k != "time" and not k.startswith("perf/")} == \
               {k: v for k, v in p.items() if k != "time" and not k.startswith("perf/")}
