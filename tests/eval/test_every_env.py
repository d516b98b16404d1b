"""evaluate (report rendered), diagnose and an env-backed serve session on every built-in env and the example plugin.

Nothing here is specific to one environment: what evaluation and serving know of an env comes from its spec.
Each env gets a tiny checkpoint (a from-scratch actor on a tokenizer of its expert's text, a from-scratch critic)
with a 2-turn limit, so each command runs in seconds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest

from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.registry import env_spec, make_env
from polyturn.cli import main
from tests.serve.conftest import RunningServer

ENVS = ["polyturn/SQLAnalyst-v0", "polyturn/TwentyQuestions-v0", "polyturn/Negotiation-v0",
        "polyturn/CustomerService-v0", "meeting"]  # "meeting": the example plugin's id (fixture meeting_env)


def ckpt_name(env_id: str) -> str:
    """``ckpt-sqlanalyst`` for ``polyturn/SQLAnalyst-v0``: one version name per env on the shared server."""
    return "ckpt-" + env_id.split("/")[-1].split("-")[0].lower()


def make_run(root: Path, env_id: str) -> Path:
    """A run directory: ``ckpt-0`` (tiny actor + separate critic + config), ``latest`` and a short metrics.jsonl."""
    from polyturn.acting.episodes import generate_demos
    from polyturn.config import load_config, save_config
    from polyturn.models.actor import tiny_actor
    from polyturn.models.chat import SIMPLE_SPECIAL_TOKENS
    from polyturn.models.critic import build_separate_critic
    from polyturn.models.critic_text import CRITIC_MARKERS
    from polyturn.models.tokenizer import train_tokenizer
    from polyturn.train.setup import corpus

    demos = list(generate_demos(env_id, episodes=4, noise=0.3, seed=0))
    run = root / env_id.replace("/", "_")
    ckpt = run / ckpt_name(env_id)
    tok = train_tokenizer(corpus(demos, privileged=False), vocab_size=400, special_tokens=SIMPLE_SPECIAL_TOKENS)
    tiny_actor(tok, hidden=32, layers=1, heads=4, seed=0).save_pretrained(ckpt / "actor")
    cfg = load_config(None, [f"env.id={env_id}", 'env.kwargs={"max_turns": 2}', "rollout.max_action_tokens=12",
                             "rollout.num_envs=2", "rollout.context_budget=512", "critic.hidden=32",
                             "critic.layers=1", "critic.max_len=128"])
    save_config(cfg, ckpt / "config.yaml")
    ctok = train_tokenizer(corpus(demos, privileged=True), vocab_size=400, special_tokens=CRITIC_MARKERS)
    build_separate_critic(encoder="scratch", tokenizer=ctok, hidden=32, layers=1, heads=4,
                          max_len=128).save_pretrained(ckpt / "critic")
    (run / "latest").write_text(ckpt.name)
    lines = [{"phase": "ppo", "iter": i, "step": i, "charts/success_rate": 0.1 * (i % 3),
              "charts/return_mean": 0.5 * i, "losses/value_loss": 1.0 / (i + 1)} for i in range(8)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, meeting_env) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("every_env")
    return {name: make_run(root, meeting_env if name == "meeting" else name) for name in ENVS}


def env_id_for(name: str, meeting_env: str) -> str:
    return meeting_env if name == "meeting" else name


@pytest.mark.parametrize("name", ENVS)
def test_evaluate_renders_a_report_from_the_spec(name, runs, meeting_env, tmp_path):
    env_id = env_id_for(name, meeting_env)
    spec = env_spec(env_id)
    cases = tmp_path / "cases.jsonl"
    assert main(["make-test-cases", "--env", env_id, "--seeds", "0:3", "--out", str(cases)]) == 0
    out = tmp_path / "eval"
    visualize = ["--visualize"] if name == "meeting" else []  # figures are env-blind and cost ~10 s an env
    assert main(["evaluate", "--policy_checkpoint", str(runs[name]), "random", "--test_cases", str(cases),
                 "--out", str(out), "--embedder", "none", *visualize]) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    metrics = json.loads((out / "metrics.json").read_text())
    assert (out / "report.html").is_file() == bool(visualize) and "Success rate" in report
    records = read_jsonl(out / "episodes" / "random.jsonl")
    for m in spec.metrics:  # the env's own metrics, over the episodes that have one, and nothing of another env's
        n = sum(m.value(r) is not None for r in records)
        assert m.title in report and metrics["metrics"]["random"][m.name]["n"] == n
    assert not spec.metrics or sum(metrics["metrics"]["random"][m.name]["n"] for m in spec.metrics) > 0
    others = {m.name for e in ENVS if e != name for m in env_spec(env_id_for(e, meeting_env)).metrics}
    assert not (others - {m.name for m in spec.metrics}) & set(metrics["definitions"])
    endings = {g["signature"].split(" | ")[0] for g in metrics["failure_signatures"]}
    named = (f"no_{spec.ending_noun()}", f"wrong_{spec.ending_noun()}") if spec.final_action else (
        "turn_limit", "ended_by(")
    assert endings and all(e.startswith((*named, "crash")) for e in endings), endings
    tree = metrics["decision_trees"]["random"]["rules"]
    assert "used_" not in tree or any(f"used_{t}" in tree for t in spec.action_types)


@pytest.mark.parametrize("name", ENVS)
def test_diagnose_checks_the_critic_in_the_env(name, runs, meeting_env, tmp_path):
    env_id = env_id_for(name, meeting_env)
    out = tmp_path / "diag"
    assert main(["diagnose", "--run", str(runs[name]), "--episodes", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "diagnose.json").read_text())
    assert summary["critic"]["episodes"] == 2
    assert all(t["turns"] for t in summary["critic"]["episode_tables"])
    # The critic was checked on this env's own held-out tasks: each table's task id is what the env gives its seed.
    env = make_env(env_id)
    for table in summary["critic"]["episode_tables"]:
        seed, task_id = re.match(r"seed (\d+) \(([^,]+),", table["episode"]).groups()
        assert env.reset(seed=int(seed))[1]["task_id"] == task_id


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory):
    from polyturn.serve.app import create_app
    from polyturn.serve.service import ServeConfig

    rec = tmp_path_factory.mktemp("every_env_rec")
    cfg = ServeConfig(checkpoints=[str(runs[n]) for n in ENVS], record_dir=str(rec), max_sessions=2)
    with RunningServer(create_app(cfg)) as srv:
        srv.record_dir = rec
        srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        yield srv


@pytest.mark.parametrize("name", ENVS)
def test_serve_opens_an_env_session(name, server, runs, meeting_env):
    env_id = env_id_for(name, meeting_env)
    oc = server.client
    assert ckpt_name(env_id) in [m.id for m in oc.models.list().data]
    s = oc.post("/sessions", body={"env": env_id, "seed": 1, "model": ckpt_name(env_id)}, cast_to=object)
    assert s["kind"] == "env" and s["question"]
    r = oc.post(f"/sessions/{s['id']}/turns", body={"max_steps": 2}, cast_to=object)
    assert len(r["turns"]) >= 1 and all("observation" in t for t in r["turns"])
    oc.delete(f"/sessions/{s['id']}", cast_to=object)
    recs = [x for x in read_jsonl(server.record_dir / "sessions.jsonl") if x["env_id"] == env_id]
    assert recs and recs[-1]["turns"]
