"""The example plugin ``examples/meeting_booking`` end to end through the ``polyturn`` command, polyturn unedited.

demos -> a short train (every phase, one iteration each) -> evaluate (report) -> diagnose -> play -> serve (an
env-backed session through the official openai client against a real uvicorn server).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import openai
import pytest
import torch

from polyturn.acting.jsonl import read_jsonl
from polyturn.cli import main
from tests.serve.conftest import RunningServer

CFG = Path(__file__).resolve().parents[2] / "configs" / "test_tiny.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, meeting_env) -> Path:
    """``polyturn demos`` then ``polyturn train`` on the example (configs/test_tiny.yaml, the env swapped)."""
    root = tmp_path_factory.mktemp("meeting")
    demos = root / "demos.jsonl"
    assert main(["demos", "--env", meeting_env, "--episodes", "16", "--noise", "0.3", "--out", str(demos)]) == 0
    recs = read_jsonl(demos)
    assert len(recs) == 16 and {r["env_id"] for r in recs} == {meeting_env}
    assert 0 < sum(r["success"] for r in recs) < 16  # noisy: some bookings clash or miss
    run = root / "run"
    sets = [f"env.id={meeting_env}", f"run.out_dir={run}", f"bc.demos={demos}", 'env.kwargs={"max_turns": 4}',
            "env.eval_episodes=4"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--config", str(CFG), *(x for kv in sets for x in ("--set", kv))]) == 0
    # The command ends with the wall time per phase and the machine it was measured on.
    assert "wall time per phase: bc " in out.getvalue()
    assert f"({torch.backends.cpu.get_cpu_capability()}, " in out.getvalue()
    return run


@pytest.mark.slow
def test_train_wrote_checkpoints_and_held_out_evaluations(trained, meeting_env):
    assert (trained / "latest").is_file() and (trained / "metrics.jsonl").is_file()
    finals = read_jsonl(trained / "eval_final.jsonl")
    assert finals and {r["env_id"] for r in finals} == {meeting_env}


@pytest.mark.slow
def test_evaluate_and_diagnose(trained, meeting_env, tmp_path):
    cases = tmp_path / "cases.jsonl"
    assert main(["make-test-cases", "--env", meeting_env, "--seeds", "0:4", "--out", str(cases)]) == 0
    out = tmp_path / "eval"
    assert main(["evaluate", "--policy_checkpoint", str(trained), "expert", "--test_cases", str(cases),
                 "--out", str(out), "--seed", "0", "--embedder", "none"]) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    metrics = json.loads((out / "metrics.json").read_text())
    assert "Clashing bookings" in report  # the env's own metric, from its spec
    assert metrics["metrics"]["expert"]["success_rate"]["value"] == 1.0
    assert all(s["signature"].split(" | ")[0] in ("no_booking", "wrong_booking", "crash")
               for s in metrics["failure_signatures"])
    assert main(["diagnose", "--run", str(trained), "--episodes", "2", "--out", str(tmp_path / "diag")]) == 0
    diag = json.loads((tmp_path / "diag" / "diagnose.json").read_text())
    assert diag["critic"]["episodes"] == 2


@pytest.mark.slow
def test_play(trained, meeting_env, capsys):
    assert main(["play", "--env", meeting_env, "--policy", str(trained), "--seed", "3"]) == 0
    assert "=== meet-" in capsys.readouterr().out
    assert main(["play", "--env", meeting_env, "--policy", "expert", "--seed", "3"]) == 0
    assert "=== success" in capsys.readouterr().out


@pytest.mark.slow
def test_serve_an_env_session_through_the_openai_client(trained, meeting_env, tmp_path):
    from polyturn.serve.app import create_app
    from polyturn.serve.service import ServeConfig

    data = tmp_path / "data"
    data.mkdir()
    (data / "team.json").write_text(json.dumps({"people": {"me": [["Mon", "09:00", "12:00"]],
                                                           "Dana": [["Mon", "13:00", "15:00"]]}}))
    cfg = ServeConfig(checkpoints=[str(trained)], record_dir=str(tmp_path / "rec"), data_dir=str(data))
    with RunningServer(create_app(cfg)) as srv:
        oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        assert meeting_env in oc.get("/envs", cast_to=object)["data"]
        s = oc.post("/sessions", body={"env": meeting_env, "seed": 2, "files": {"calendar": "team.json"}},
                    cast_to=object)
        assert s["kind"] == "env" and "with Dana" in s["question"]  # the only other person in the file
        r = oc.post(f"/sessions/{s['id']}/turns", body={"max_steps": 4}, cast_to=object)
        assert r["turns"] and all("observation" in t for t in r["turns"])
        with pytest.raises(openai.BadRequestError, match="file kind"):
            oc.post("/sessions", body={"env": meeting_env, "files": {"database": "team.json"}}, cast_to=object)
        oc.delete(f"/sessions/{s['id']}", cast_to=object)
    (rec,) = read_jsonl(tmp_path / "rec" / "sessions.jsonl")
    assert rec["env_id"] == meeting_env and rec["turns"]
