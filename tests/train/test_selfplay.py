"""Self-play on Negotiation-v0 (opponent: self): policies per role or shared, the opponent pool, role-masked
updates, and evaluation-only partners that no training path reaches."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from polyturn.config import load_config
from polyturn.train.logger import read_metrics
from polyturn.train.selfplay import OpponentPool, SelfPlay
from polyturn.train.trainer import Trainer

pytestmark = pytest.mark.xdist_group("selfplay")  # the module's demonstrations and shared run, built once

NEG = "polyturn/Negotiation-v0"
CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"
SRC = Path(__file__).parents[2] / "src" / "polyturn"


@pytest.fixture(scope="module")
def neg_demos(tmp_path_factory) -> Path:
    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl

    path = tmp_path_factory.mktemp("neg") / "demos.jsonl"
    write_jsonl(path, generate_demos(NEG, episodes=16, noise=0.3, seed=0))
    return path


def _cfg(out: Path, demos: Path, *extra: str):
    return load_config(CFG, [f"run.out_dir={out}", f"bc.demos={demos}", f"env.id={NEG}", "env.kwargs={opponent: self}",
                             "rollout.max_action_tokens=32", "curriculum.epsilon={start: 0.5, end: 0.5}", *extra])


@pytest.mark.slow
def test_a_policy_per_role_trains_two_iterations_and_resumes(tmp_path, neg_demos):
    args = ("selfplay.weights=per_role", "critic.kind=none", "critic.group_size=2",
            "selfplay.mix={latest: 0.5, pool: 0.25, scripted: 0.25}", "selfplay.snapshot_every=1",
            "curriculum.warmup_iters=0", "curriculum.mixed_iters=1", "curriculum.ppo_iters=1")
    summary = Trainer(_cfg(tmp_path / "run", neg_demos, *args)).run()
    assert set(summary["eval"]) >= {"bc", "final"}
    rl = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] in ("mixed", "ppo")]
    assert len(rl) == 2
    for name in ("first", "second"):  # each policy's update, logged apart
        assert f"{name}/losses/actor_loss" in rl[-1] and f"{name}/losses/approx_kl" in rl[-1]
    assert "selfplay/games_latest" in rl[0] and "selfplay/pool_size" in rl[0]
    final = tmp_path / "run" / "ckpt-final"
    assert (final / "actor").is_dir() and (final / "roles" / "second" / "actor").is_dir()
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["pool"] == ["iter0000", "iter0001", "iter0002"] and set(state["actor_steps"]) == {"first", "second"}
    assert all((tmp_path / "run" / "pool" / e / n).is_dir() for e in state["pool"] for n in ("first", "second"))
    # Resume from the first iteration's checkpoint: both policies and the pool come back, the run goes on.
    (tmp_path / "run" / "latest").write_text("ckpt-iter0001")
    again = Trainer(_cfg(tmp_path / "run", neg_demos, *args), resume=True)
    assert again.state.iter == 1 and again.state.pool == ["iter0000", "iter0001"]
    saved = torch.load(tmp_path / "run" / "ckpt-iter0001" / "optim.pt", weights_only=False)
    assert again.policies["second"].opt.state_dict()["state"].keys() == saved["second/actor"]["state"].keys()
    assert again.run()["eval"]["final"]["episodes"] == summary["eval"]["final"]["episodes"]


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory, neg_demos) -> Path:
    """A two-iteration self-play run with shared weights and a centralized (privileged) critic."""
    out = tmp_path_factory.mktemp("shared") / "run"
    Trainer(_cfg(out, neg_demos, "critic.privileged=true", "curriculum.warmup_iters=0", "curriculum.mixed_iters=1",
                 "curriculum.ppo_iters=1")).run()
    return out


@pytest.mark.slow
def test_shared_weights_train_on_both_roles_with_a_centralized_critic(shared_run):
    rl = [r for r in read_metrics(shared_run / "metrics.jsonl") if r["phase"] in ("mixed", "ppo")]
    assert len(rl) == 2 and "losses/explained_variance" in rl[-1] and "losses/actor_loss" in rl[-1]
    assert "selfplay/first/success_rate" in rl[-1] and "selfplay/second/success_rate" in rl[-1]
    state = json.loads((shared_run / "ckpt-final" / "trainer_state.json").read_text())
    assert isinstance(state["actor_steps"], int) and not (shared_run / "ckpt-final" / "roles").exists()
    # Held-out games seat the policy in each role in turn against the scripted training partners; the centralized
    # critic read the other side's values as its privileged text.
    recs = [json.loads(line) for line in (shared_run / "eval_final.jsonl").read_text().splitlines()]
    assert [r["role"] for r in recs[:4]] == ["first", "second", "first", "second"] and len(recs) == 8
    assert all(r["privileged"].startswith("Opponent values:") for r in recs if r["turns"])


def test_the_centralized_critic_is_refused_at_evaluation_and_serving(shared_run):
    from polyturn.models.critic import SeparateCritic
    from polyturn.rollout.best_of import PrivilegedCriticError, deployable_scorer
    from polyturn.serve.explore import ExploreSettings
    from polyturn.serve.service import ServeConfig, Service

    ckpt = shared_run / "ckpt-final"
    assert SeparateCritic.from_pretrained(ckpt / "critic").config.include_privileged
    gate = dict(epsilon=1.0, candidates=2, min_value=0.0)
    with pytest.raises(ValueError, match="unprivileged critic"):
        Service(ServeConfig(checkpoints=[str(ckpt)], explore=ExploreSettings(**gate)))._load_critic(ckpt)
    # Evaluation's best-of-n refuses it too: it reads privileged text, and as a state-value critic it ranks no turns.
    with pytest.raises((PrivilegedCriticError, ValueError), match="privileged|ranks no actions"):
        deployable_scorer(str(ckpt / "critic"), oracle=False)


@pytest.mark.slow
def test_a_self_play_checkpoint_is_served_in_either_seat(shared_run):
    import httpx

    from polyturn.serve.app import create_app
    from polyturn.serve.service import ServeConfig
    from tests.serve.conftest import RunningServer

    with RunningServer(create_app(ServeConfig(checkpoints=[str(shared_run / "ckpt-final")]))) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        for role, partner in (("first", "tough"), ("second", "fair")):
            s = client.post("/v1/sessions", json={"env": NEG, "seed": 3, "role": role, "partner": partner}).json()
            task = " ".join(m["content"] for m in s["messages"])
            assert ("They make the first offer" in task) == (role == "second"), s
            out = client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 25}).json()
            assert out["session"]["done"] and out["turns"], out
        bad = client.post("/v1/sessions", json={"env": NEG, "role": "third"})
        assert bad.status_code == 400 and "role among" in bad.json()["error"]["message"]
        bad = client.post("/v1/sessions", json={"env": NEG, "partner": "tit_for_tat"})
        assert bad.status_code == 400 and "partner among" in bad.json()["error"]["message"]  # evaluation-only


def _policy_pair(tmp_path, neg_demos):
    return Trainer(_cfg(tmp_path / "run", neg_demos, "selfplay.weights=per_role", "critic.kind=none",
                        "critic.group_size=2"))


def test_a_roles_update_touches_only_its_own_policy(tmp_path, neg_demos):
    tr = _policy_pair(tmp_path, neg_demos)
    tasks = tr.next_tasks(8, 0.0)
    games, _ = tr.selfplay.games(tasks, 0, group=2)
    played = tr.collector.collect(games, temperature=1.0, epsilon=0.5, rng=tr.rng, generator=tr.gen)
    batches, _ = tr.selfplay.batches(played)
    assert batches["first"] and all(ep.policy == "first" and ep.role == "first" for ep in batches["first"])
    assert all(ep.policy == "second" and ep.role == "second" for ep in batches["second"])
    before = {n: {k: v.clone() for k, v in p.actor.model.state_dict().items()} for n, p in tr.policies.items()}
    tr.learn(1, {"first": batches["first"], "second": []}, gen_s=1.0)
    after = {n: p.actor.model.state_dict() for n, p in tr.policies.items()}
    assert any(not torch.equal(after["first"][k], v) for k, v in before["first"].items())
    assert all(torch.equal(after["second"][k], v) for k, v in before["second"].items())


def test_pool_and_partner_draws(tmp_path, neg_demos):
    tr = _policy_pair(tmp_path, neg_demos)
    sp: SelfPlay = tr.selfplay
    pool: OpponentPool = sp.pool
    assert pool.size == 5
    for it in range(7):  # snapshots beyond the pool's size: the oldest leave the pool (a resume may still need them)
        pool.snapshot(it, {n: p.actor for n, p in tr.policies.items()})
    assert tr.state.pool == [f"iter{i:04d}" for i in range(2, 7)]
    assert (tmp_path / "run" / "pool" / "iter0000" / "first").is_dir()
    tasks = [{"seed": s, "options": {}} for s in range(400) for _ in range(2)]
    sp.mix = {"latest": 0.5, "pool": 0.3, "scripted": 0.2}
    games, m = sp.games(tasks, 3, group=2)
    names = [[s.name for s in g["seats"].values()] for g in games]
    assert names == [[s.name for s in g["seats"].values()] for g in sp.games(tasks, 3, group=2)[0]]  # (seed, it)
    assert names != [[s.name for s in g["seats"].values()] for g in sp.games(tasks, 4, group=2)[0]]
    assert m["selfplay/games_latest"] == pytest.approx(0.5, abs=0.07)
    assert m["selfplay/games_pool"] == pytest.approx(0.3, abs=0.07)
    assert m["selfplay/games_scripted"] == pytest.approx(0.2, abs=0.07)
    for g, h in zip(games[0::2], games[1::2]):  # a task group shares its seats
        assert [s.name for s in g["seats"].values()] == [s.name for s in h["seats"].values()]
    kinds = {}
    for g in games:
        names = {r: s.name for r, s in g["seats"].items()}
        learners = [r for r, n in names.items() if n == r]  # per-role policies are named by their role
        assert learners, names
        other = [n for n in names.values() if n not in ("first", "second")]
        kind = "latest" if not other else other[0].split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "pool":  # the other seat is a frozen earlier checkpoint of the other role's policy
            role = next(r for r, n in names.items() if n.startswith("pool:"))
            actor = g["seats"][role].actor
            assert actor is not tr.policies[role].actor and not any(p.requires_grad for p in actor.model.parameters())
            assert names[role].split(":")[1] in tr.state.pool
        if kind == "scripted":
            assert other[0].split(":")[1] in ("conceding", "fair", "tough")
    assert set(kinds) == {"latest", "pool", "scripted"}


def test_scripted_partners_are_named_from_the_training_ones(tmp_path, neg_demos):
    with pytest.raises(ValueError, match="training partners"):
        Trainer(_cfg(tmp_path / "a", neg_demos, "selfplay.scripted=[tit_for_tat]"))
    tr = Trainer(_cfg(tmp_path / "b", neg_demos, "selfplay.scripted=[tough]"))
    assert sorted(tr.selfplay.partners) == ["tough"]


def test_evaluation_only_partners_are_absent_from_every_training_path(tmp_path, neg_demos, monkeypatch):
    from polyturn.envs.negotiation import holdout

    # No training-side module imports them or reads the spec field that points at them.
    for path in [*(SRC / "train").rglob("*.py"), *(SRC / "acting").rglob("*.py"), *(SRC / "rollout").rglob("*.py"),
                 *(SRC / "config").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "holdout" not in (node.module or "") and all("holdout" not in a.name for a in node.names), path
            if isinstance(node, ast.Import):
                assert all("holdout" not in a.name for a in node.names), path
            if isinstance(node, ast.Attribute):
                assert node.attr != "holdout_partners", path
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
                assert "holdout" not in node.value.split(":")[0], path  # no "package.module:NAME" reference
    # A run that draws scripted partners never makes one.
    made = []
    for name, factory in holdout.HOLDOUT_PLAYERS.items():
        monkeypatch.setitem(holdout.HOLDOUT_PLAYERS, name, lambda name=name: made.append(name))
    tr = Trainer(_cfg(tmp_path / "run", neg_demos, "selfplay.mix={latest: 0.2, scripted: 0.8}",
                      "curriculum.warmup_iters=1", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0"))
    tr.run()
    assert made == []
    seen = {json.loads(line)["partner"] for line in (tmp_path / "run" / "eval_final.jsonl").read_text().splitlines()}
    assert seen <= {"scripted:conceding", "scripted:fair", "scripted:tough"}


def test_selfplay_benchmark_runs_in_quick_mode(shared_run, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("selfplay_bench", Path(__file__).parents[2] / "benchmarks" /
                                                  "selfplay.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--quick", "--run", str(shared_run)])
    (figs,) = rows[f"run {shared_run.name}"]
    assert {"holdout/first/return", "holdout/second/return", "training/both/success"} <= set(figs)
    assert figs["ev"] is None or figs["ev"] == figs["ev"]
    assert "| run run | 1 |" in capsys.readouterr().out


def test_selfplay_refuses_what_it_cannot_run(tmp_path, neg_demos):
    for extra, fix in ((["rollout.workers=1", "rollout.num_envs=2"], "rollout.workers=0"),
                       (["critic.kind=action", "rollout.best_of=2", "ppo.algo=critic_rft"], "rollout.best_of=1")):
        with pytest.raises(ValueError, match=fix):
            Trainer(_cfg(tmp_path / fix, neg_demos, *extra))


@pytest.mark.slow
def test_a_resumed_self_play_run_ends_where_the_uninterrupted_one_does(tmp_path, neg_demos):
    """Pool, partner draws and both seats' sampling continue exactly: the same final weights, bit for bit."""
    from tests.train.conftest import assert_same_weights, stopped_copy

    args = ("critic.privileged=true", "selfplay.mix={latest: 0.4, pool: 0.4, scripted: 0.2}",
            "selfplay.snapshot_every=1", "curriculum.warmup_iters=1", "curriculum.mixed_iters=1",
            "curriculum.ppo_iters=1", "env.kwargs={opponent: self, max_turns: 6}")  # short games: exactness holds
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(_cfg(straight, neg_demos, *args)).run()
    stopped_copy(straight, resumed, at="ckpt-iter0001", later=("ckpt-iter0002", "ckpt-iter0003", "ckpt-final"))
    Trainer(_cfg(resumed, neg_demos, *args), resume=True).run()
    assert_same_weights(straight / "ckpt-final", resumed / "ckpt-final")
    a = json.loads((straight / "ckpt-final" / "trainer_state.json").read_text())
    b = json.loads((resumed / "ckpt-final" / "trainer_state.json").read_text())
    assert a["pool"] == b["pool"] and a["task_counter"] == b["task_counter"]
