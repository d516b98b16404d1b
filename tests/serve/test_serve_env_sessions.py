"""benchmarks/serve_env_sessions.py: concurrent env-backed sessions through a real `polyturn serve`, recorded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from polyturn.config import load_config
from polyturn.acting.jsonl import read_jsonl
from polyturn.train.setup import load_or_make_demos

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_env_sessions.py"


def _script():
    spec = importlib.util.spec_from_file_location("serve_env_sessions", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_customer_service_sessions_are_served_counted_and_recorded_as_training_episodes(tmp_path):
    figs = _script().main(["--quick", "--record", str(tmp_path / "rec"), "--json", str(tmp_path / "out.json")])
    assert figs["episodes"] == 4 and 0.0 <= figs["completion"] <= 1.0
    assert 0 < figs["p50_s"] <= figs["p99_s"] <= figs["max_s"]
    import json

    episodes = {e["seed"]: e for e in json.loads((tmp_path / "out.json").read_text())["episodes"]}
    path = tmp_path / "rec" / "sessions.jsonl"
    records = list(read_jsonl(path))
    assert sorted(r["seed"] for r in records) == sorted(episodes)
    for r in records:
        assert r["env_id"] == "polyturn/CustomerService-v0" and r["turns"]
        # The script's error count is the environment's own counter (error_responses, kept in the features).
        assert r["turns"][-1]["info"]["features"]["n_errors"] == episodes[r["seed"]]["error_responses"]
        assert len(r["turns"]) == episodes[r["seed"]]["turns"]
        assert all(len(t["action_ids"]) == len(t["logprobs"]) == t["n_tokens"] for t in r["turns"])
    # Training reads the recorded sessions as demonstrations, as they are.
    demos = load_or_make_demos(load_config(None, [f"bc.demos={path}", "env.id=polyturn/CustomerService-v0"]),
                               tmp_path)
    assert {d["session_id"] for d in demos} == {r["session_id"] for r in records}


def test_engine_both_and_lora_both_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        _script().main(["--quick", "--engine", "both", "--lora", "both"])
    assert "give one of them" in capsys.readouterr().err
