"""The offline phase (config ``offline``): the data's summary and errors, recorded token ids, each algorithm on a
mixed-quality dataset then two online iterations, value pre-training's explained variance, and resume."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.config import ConfigError, load_config
from polyturn.train.logger import read_metrics
from polyturn.train.offline_data import (data_summary, held_out_split, read_offline_data, record_episode,
                                         record_tokens, summary_lines)
from polyturn.train.reporting import NullReporter
from polyturn.train.trainer import Trainer, check_run

from .conftest import assert_same_weights, stopped_copy

SQL = "polyturn/SQLAnalyst-v0"
#: Two online iterations after the offline phase (no critic warm-up), small offline epochs.
SHORT = ("curriculum.warmup_iters=0", "curriculum.mixed_iters=1", "curriculum.ppo_iters=1", "offline.critic_epochs=2",
         "offline.epochs=1", "offline.batch_episodes=8", "offline.held_out=0.2")


class Recorder(NullReporter):
    """Keeps the reporter's messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)


@pytest.fixture(scope="module")
def mixed_data(tmp_path_factory, make_cfg) -> list[Path]:
    """A mixed-quality dataset: 12 demonstrations of a very noisy expert, and the held-out evaluation records of a
    tiny BC checkpoint (it fails every task)."""
    from polyturn.acting.episodes import generate_demos

    d = tmp_path_factory.mktemp("offline_data")
    noisy = d / "noisy.jsonl"
    write_jsonl(noisy, generate_demos(SQL, episodes=12, noise=0.6, seed=100))
    Trainer(make_cfg(d / "tiny", "curriculum.warmup_iters=0", "curriculum.mixed_iters=0",
                     "curriculum.ppo_iters=0")).run()
    return [noisy, d / "tiny" / "eval_bc.jsonl"]


def offline_cfg(make_cfg, out: Path, data: list[Path], *extra: str):
    return make_cfg(out, f"offline.data={json.dumps([str(p) for p in data])}", *SHORT, *extra)


# ---- the data ---------------------------------------------------------------------------------------------------
def _record(ret: float, *, seed: int, success: bool = False, **fields) -> dict:
    turn = {"observation": "q", "action": "Action: list_tables[{}]", "reward": ret, "reward_terms": {},
            "terminated": True, "truncated": False, "info": {"action_type": "list_tables", "features": {"x": 1.0},
                                                             "privileged": "after"}}
    return {"env_id": SQL, "seed": seed, "task_id": f"t{seed}", "policy": "noisy(0.3)", "success": success,
            "return": ret, "question": "q", "privileged": "before", "turns": [turn], "final_observation": "done",
            **fields}


def test_the_summary_reports_the_return_distribution_and_policy_versions(tmp_path):
    recs = [_record(1.0, seed=0), _record(2.0, seed=1), _record(3.0, seed=2, policy="ckpt", policy_version="v2"),
            _record(10.0, seed=3, success=True, policy="ckpt", policy_version="v2"),
            {**_record(5.0, seed=4), "crashed": True}, {**_record(0.0, seed=5), "turns": []}]
    write_jsonl(tmp_path / "a.jsonl", recs[:3])
    write_jsonl(tmp_path / "b.jsonl", recs[3:])
    data = read_offline_data([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], env_id=SQL)
    s = data_summary(data)
    assert s["episodes"] == 4 and s["skipped"] == {"crashed": 1, "no turns": 1}
    assert (s["return_mean"], s["return_min"], s["return_max"], s["return_q50"]) == (4.0, 1.0, 10.0, 2.5)
    assert s["return_q25"] == pytest.approx(1.75) and s["success_rate"] == 0.25 and s["turns_mean"] == 1.0
    assert s["by_policy"] == [
        {"policy": "noisy(0.3)", "policy_version": "unknown", "episodes": 2, "return_mean": 1.5, "success_rate": 0.0},
        {"policy": "ckpt", "policy_version": "v2", "episodes": 2, "return_mean": 6.5, "success_rate": 0.5}]
    lines = summary_lines(s, SQL)
    assert lines[0] == f"offline data: 4 episodes of {SQL} from 2 file(s) (skipped: 1 crashed, 1 no turns)"
    assert lines[1].startswith("  return: mean 4.00, std 3.54; min 1.00, q10 1.30, q25 1.75, q50 2.50")
    assert "noisy(0.3) / unknown: 2 episodes, return mean 1.50, success rate 0.000" in lines[-2]
    # Held out by task: 1 of the 4 tasks at 25%, never all of them.
    train, held = held_out_split(data.records, 0.25, seed=0)
    assert len(held) == 1 and sorted(train + held) == [0, 1, 2, 3]
    assert held_out_split(data.records, 0.0, seed=0) == ([0, 1, 2, 3], [])
    assert len(held_out_split(data.records[:1], 0.5, seed=0)[1]) == 0


def test_the_reader_refuses_missing_files_and_other_envs(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"offline.data; `polyturn demos --out FILE`"):
        read_offline_data([str(tmp_path / "none.jsonl")], env_id=SQL)
    write_jsonl(tmp_path / "tq.jsonl", [_record(1.0, seed=0), {**_record(1.0, seed=1), "env_id": "polyturn/TwentyQuestions-v0"}])
    with pytest.raises(ValueError, match=r"record 2 of .*tq.jsonl is an episode of 'polyturn/TwentyQuestions-v0', "
                                         r"expected env.id = 'polyturn/SQLAnalyst-v0'"):
        read_offline_data([str(tmp_path / "tq.jsonl")], env_id=SQL)
    write_jsonl(tmp_path / "chat.jsonl", [{**_record(0.0, seed=0), "env_id": "chat"}])
    with pytest.raises(ValueError, match="a chat session"):
        read_offline_data([str(tmp_path / "chat.jsonl")], env_id=SQL)
    write_jsonl(tmp_path / "metrics.jsonl", [{"step": 0, "phase": "bc", "losses/bc_loss": 1.0}])
    with pytest.raises(ValueError, match="Expected an episode record.*not a metrics log"):
        read_offline_data([str(tmp_path / "metrics.jsonl")], env_id=SQL)
    write_jsonl(tmp_path / "crashed.jsonl", [{**_record(0.0, seed=0), "crashed": True}])
    with pytest.raises(ValueError, match="at least one episode with turns"):
        read_offline_data([str(tmp_path / "crashed.jsonl")], env_id=SQL)


def test_config_errors_name_the_field_and_the_fix(tmp_path, make_cfg, demos):
    data = f"offline.data=[{demos}]"
    for extra, match in [
        (("offline.algo=iql",), "set critic.q=true"),
        (("offline.algo=cql",), "set critic.q=true"),
        (("critic.kind=none",), "set critic.kind=separate"),
        (("critic.kind=none", "offline.algo=filtered_bc", "offline.value_pretrain=true"), "set critic.kind=separate"),
        (("offline.algo=none",), "set offline.value_pretrain=true"),
        (("offline.algo=none", "offline.value_pretrain=true"), "set offline.after_bc=true"),
        (("offline.algo=iql", "critic.q=true", "offline.value_pretrain=true"), "drop offline.value_pretrain"),
        (("offline.min_return=1.0",), "set offline.algo=filtered_bc"),
    ]:
        with pytest.raises(ConfigError, match=match):
            make_cfg(tmp_path, data, *extra)
    with pytest.raises(ConfigError, match=r"offline.data: required, got none \(the episode JSONL files: polyturn train "
                                          r"--offline DATA"):
        make_cfg(tmp_path, "offline.algo=awr")
    make_cfg(tmp_path, data, "critic.kind=none", "offline.algo=filtered_bc")  # filtered BC reads no critic
    assert make_cfg(tmp_path, f"offline.data={demos}").offline.data == [str(demos)]  # one path, no list
    with pytest.raises(ValueError, match="drop --nproc"):
        check_run(make_cfg(tmp_path, data), world_size=2)
    # A missing file and another env's records are refused before the run makes anything.
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="offline.data"):
        Trainer(make_cfg(out, f"offline.data=[{tmp_path / 'missing.jsonl'}]"))
    write_jsonl(tmp_path / "tq.jsonl", [{**_record(1.0, seed=0), "env_id": "polyturn/TwentyQuestions-v0"}])
    with pytest.raises(ValueError, match="set env.id to the records' env"):
        Trainer(make_cfg(out, f"offline.data=[{tmp_path / 'tq.jsonl'}]"))
    assert not out.exists()


def test_the_command_line_sets_offline_data(tmp_path):
    from polyturn.cli import build_parser
    from polyturn.cli.train import overrides

    args = build_parser().parse_args(["train", "--offline", "a b.jsonl", "c.jsonl", "--set", "offline.algo=iql"])
    assert load_config(None, [*overrides(args), "critic.q=true"]).offline.data == ["a b.jsonl", "c.jsonl"]
    assert overrides(build_parser().parse_args(["train"])) == []


def test_recorded_action_ids_are_kept_and_records_become_episodes(demos, make_cfg, tmp_path):
    from polyturn.acting.registry import make_env
    from polyturn.rollout.context import RolloutSettings, tokenize_demo
    from polyturn.train.setup import build_actor

    cfg = make_cfg(tmp_path)
    recs = read_jsonl(demos)
    actor = build_actor(cfg, recs, make_env(SQL).unwrapped.tool_docs())
    settings = RolloutSettings(max_action_tokens=48, context_budget=512)
    rec = copy.deepcopy(recs[0])
    as_bc = tokenize_demo(actor, settings, rec)
    for k, turn in enumerate(rec["turns"]):  # as a served session records them: the sampled ids and log-probs
        turn["action_ids"] = actor.encode(turn["action"])[:47] + [actor.stop_id]
        turn["logprobs"] = [-0.5 - k] * len(turn["action_ids"])
    tokens, kept = record_tokens(actor, settings, rec, system=None)
    assert kept and [s.ids for s in tokens.segments] == [s.ids for s in as_bc.segments]
    ep = record_episode(rec, tokens.segments)
    assert [t.action_ids for t in ep.turns] == [t["action_ids"] for t in rec["turns"]]
    assert [t.logprobs for t in ep.turns] == [t["logprobs"] for t in rec["turns"]]
    # Ids of another tokenizer do not decode to the action: the record is tokenized from its text instead.
    rec["turns"][0]["action_ids"] = [5, 6, 7]
    tokens, kept = record_tokens(actor, settings, rec, system=None)
    assert not kept and [s.ids for s in tokens.segments] == [s.ids for s in as_bc.segments]
    # A turn's state is the one before it; the last turn carries the record's outcome.
    turns = rec["turns"]
    assert ep.turns[0].privileged == rec["privileged"] and ep.turns[0].features == {}
    assert ep.turns[1].features == turns[0]["info"]["features"]
    assert ep.final_features == turns[-1]["info"]["features"]
    assert ep.success == rec["success"] and ep.episode_return == pytest.approx(rec["return"])
    assert ep.terminated == turns[-1]["terminated"]


# ---- runs -------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["filtered_bc", "awr", "iql", "cql"])
def test_each_algorithm_then_two_online_iterations(algo, tmp_path, make_cfg, mixed_data):
    from transformers import AutoModelForCausalLM

    extra = {"filtered_bc": ("critic.kind=none", "critic.group_size=2"), "iql": ("critic.q=true",),
             "cql": ("critic.q=true", "offline.cql_candidates=2")}.get(algo, ())
    rep = Recorder()
    cfg = offline_cfg(make_cfg, tmp_path, mixed_data, f"offline.algo={algo}", *extra)
    summary = Trainer(cfg, reporter=rep).run()
    assert rep.messages[0] == f"offline data: 20 episodes of {SQL} from 2 file(s)"  # the data's summary comes first
    assert rep.messages[1].startswith("  return: mean") and rep.messages[3] == "  by policy / policy version:"
    assert "noisy(0.6) / unknown: 12 episodes" in rep.messages[4] and "bc / unknown: 8 episodes" in rep.messages[5]
    assert set(summary["eval"]) == {"offline", "final"}  # the offline phase replaced BC
    assert list(summary["phase_s"]) == ["offline", "eval_offline", "rl", "eval_final"]
    recs = read_metrics(tmp_path / "metrics.jsonl")
    phases = [r["phase"] for r in recs]
    assert phases[0] == "offline_data" and "bc" not in phases
    assert recs[0]["offline/data_episodes"] == 20 and recs[0]["offline/data_return_min"] <= recs[0]["offline/data_return_q50"]
    actor = [r for r in recs if r["phase"] == "offline_actor"]
    assert actor and all(math.isfinite(r["offline/actor_loss"]) and r["offline/actor_loss"] > 0 for r in actor)
    critic = [r for r in recs if r["phase"] == "offline_critic"]
    if algo == "filtered_bc":
        assert not critic and 10 <= actor[-1]["offline/kept_episodes"] < 20  # the top half of 20 (ties kept)
        assert actor[-1]["offline/actor_loss"] == pytest.approx(actor[-1]["offline/nll"])  # weights 1: plain NLL
    else:
        assert 0 < actor[-1]["offline/weight_mean"] and actor[-1]["offline/weight_max"] <= 20.0
        key = {"awr": "offline/value_loss", "iql": "offline/v_loss", "cql": "offline/penalty"}[algo]
        assert all(math.isfinite(r[key]) for r in critic if key in r) and any(key in r for r in critic)
        assert "offline/value_explained_variance" in critic[-1]
        assert any("held-out explained variance" in m for m in rep.messages)
    if algo == "cql":
        assert all(r["offline/penalty"] > 0 for r in critic if "offline/penalty" in r)
    # Then the usual online phases, logged after the offline steps, from the offline phase's checkpoint.
    rl = [r for r in recs if r["phase"] in ("mixed", "ppo")]
    assert [r["iter"] for r in rl] == [0, 1] and rl[0]["step"] > max(r["step"] for r in actor + critic)
    assert "losses/value_loss" in rl[-1] or algo == "filtered_bc"
    AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt-offline" / "actor")
    state = json.loads((tmp_path / "ckpt-offline" / "trainer_state.json").read_text())
    assert state["phase"] == "rl" and state["iter"] == 0


def test_critic_micro_batches_give_each_row_its_own_output(tiny_tokenizer):
    """The offline critic scores rows in length-sorted micro-batches and puts them back in the rows' order: the
    outputs of a whole batch, row for row (a critic with random weights, so the rows' values differ)."""
    from polyturn.models.critic import build_separate_critic
    from polyturn.models.critic_text import CriticInput
    from polyturn.train.offline import micro_forward

    torch.manual_seed(0)
    net = build_separate_critic(encoder="scratch", tokenizer=tiny_tokenizer, hidden=32, layers=1, heads=4,
                                max_len=256, include_privileged=True)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    inputs = [CriticInput(task=f"Which product sold most in {m}?", privileged="gold: widget",
                          history=[("Action: list_tables[{}]", "Tables: sales " * (3 * m))] * (m % 4))
              for m in range(12)]
    whole = net(net.encode(inputs))["value"]
    assert whole.std() > 1e-2  # rows that a permutation would visibly change
    for budget in (16, 200, None):
        assert torch.allclose(micro_forward(net, inputs, budget)["value"], whole, atol=1e-5), budget


@pytest.mark.slow
def test_value_pretraining_reports_its_held_out_explained_variance(tmp_path, make_cfg, mixed_data, demos):
    rep = Recorder()
    cfg = offline_cfg(make_cfg, tmp_path / "run", mixed_data, "offline.algo=none", "offline.value_pretrain=true",
                      "offline.after_bc=true", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0")
    summary = Trainer(cfg, reporter=rep).run()
    assert list(summary["phase_s"]) == ["bc", "eval_bc", "offline", "eval_offline", "eval_final"]  # BC, then V
    recs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    ev = [r for r in recs if "offline/value_explained_variance" in r]
    assert len(ev) == 2 and all(math.isfinite(r["offline/value_explained_variance"]) for r in ev)  # one per epoch
    assert not any(r["phase"] == "offline_actor" for r in recs)
    said = [m for m in rep.messages if "held-out explained variance" in m]
    assert len(said) == 1 and said[0].endswith(f"{ev[-1]['offline/value_explained_variance']:.3f}")
    # The critic learned, the actor is BC's.
    assert_same_weights(tmp_path / "run" / "ckpt-bc", tmp_path / "run" / "ckpt-offline", parts=())
    from polyturn.models.critic import SeparateCritic

    before = SeparateCritic.from_pretrained(tmp_path / "run" / "ckpt-bc" / "critic").state_dict()
    after = SeparateCritic.from_pretrained(tmp_path / "run" / "ckpt-offline" / "critic").state_dict()
    assert any(not torch.equal(v, after[k]) for k, v in before.items())

    # Returns that are all the same (one-turn episodes worth 1.0): explained variance is ill-conditioned, and said so.
    same = [{**_record(1.0, seed=s), "turns": [{**r["turns"][0], "reward": 1.0, "terminated": True}]}
            for s, r in enumerate(read_jsonl(demos))]
    write_jsonl(tmp_path / "same.jsonl", same)
    rep = Recorder()
    cfg = offline_cfg(make_cfg, tmp_path / "same", [tmp_path / "same.jsonl"], "offline.algo=none",
                      "offline.value_pretrain=true", "offline.after_bc=true", "curriculum.mixed_iters=0",
                      "curriculum.ppo_iters=0", "offline.critic_epochs=1", "env.eval_episodes=1")
    Trainer(cfg, reporter=rep).run()
    said = [m for m in rep.messages if "held-out explained variance" in m]
    assert len(said) == 1 and "ill-conditioned: the held-out returns are nearly constant" in said[0]
    ev = [r for r in read_metrics(tmp_path / "same" / "metrics.jsonl") if "offline/value_explained_variance" in r]
    assert ev[-1]["offline/value_explained_variance"] == "nan"


@pytest.mark.slow
def test_an_offline_phase_killed_midway_restarts_on_resume(tmp_path, make_cfg, mixed_data):
    straight = tmp_path / "straight"
    cfg = offline_cfg(make_cfg, straight, mixed_data, "offline.after_bc=true", "curriculum.mixed_iters=0",
                      "curriculum.ppo_iters=0")
    Trainer(cfg).run()
    state = json.loads((straight / "ckpt-bc" / "trainer_state.json").read_text())
    assert state["phase"] == "offline"  # BC's checkpoint says the offline phase is still to run
    # Killed during the offline phase: the last checkpoint is BC's, and the phase's first records are in the log.
    killed = tmp_path / "killed"
    stopped_copy(straight, killed, at="ckpt-bc", later=("ckpt-offline", "ckpt-final"))
    recs = read_metrics(killed / "metrics.jsonl")
    n_first = next(i for i, r in enumerate(recs) if r["phase"] == "eval_offline")
    write_jsonl(killed / "metrics.jsonl", recs[:n_first - 2])
    tr = Trainer(offline_cfg(make_cfg, killed, mixed_data, "offline.after_bc=true", "curriculum.mixed_iters=0",
                             "curriculum.ppo_iters=0"), resume=True)
    assert tr.state.phase == "offline"
    tr.run()
    assert_same_weights(straight / "ckpt-offline", killed / "ckpt-offline")  # restarted from BC's checkpoint: the same
    got = [(r["step"], r["phase"]) for r in read_metrics(killed / "metrics.jsonl")]
    assert got == [(r["step"], r["phase"]) for r in read_metrics(straight / "metrics.jsonl")]  # no record twice


@pytest.mark.slow
def test_a_given_actor_is_evaluated_then_trained_offline(tmp_path, make_cfg, mixed_data):
    start = mixed_data[1].parent / "ckpt-bc"  # the tiny BC checkpoint that wrote the evaluation records
    cfg = offline_cfg(make_cfg, tmp_path, mixed_data, f"actor.init_from={start}", "offline.algo=filtered_bc",
                      "critic.kind=none", "critic.group_size=2", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0",
                      "env.eval_episodes=2")
    summary = Trainer(cfg).run()
    assert list(summary["phase_s"]) == ["eval_bc", "offline", "eval_offline", "eval_final"]
    assert set(summary["eval"]) == {"bc", "offline", "final"}
