"""Exploration in production: off by default; when on, explored turns are forced, counted and recorded."""

from __future__ import annotations

import httpx

from polyturn.demos import read_jsonl
from polyturn.serve.app import create_app
from polyturn.serve.explore import ExploreSettings
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import RunningServer


def _turns(srv, n):
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        outs = [c.post(f"/v1/sessions/{sid}/turns", json={"message": f"hello {k}"}).json() for k in range(n)]
        c.delete(f"/v1/sessions/{sid}")
        return outs, c.get("/metrics").text


def test_exploration_is_off_by_default(checkpoints):
    assert ServeConfig(checkpoints=["x"]).explore.epsilon == 0.0
    with RunningServer(create_app(ServeConfig(checkpoints=[str(checkpoints[0])]))) as srv:
        outs, metrics = _turns(srv, 3)
    assert not any(t["forced"] for o in outs for t in o["turns"])
    assert "polyturn_explorations_total{" not in metrics


def test_explored_turns_are_forced_counted_and_recorded(checkpoints, tmp_path):
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], record_dir=str(tmp_path),
                      explore=ExploreSettings(epsilon=1.0, candidates=3, temperature=1.5, min_mean_logprob=-50.0))
    with RunningServer(create_app(cfg)) as srv:
        outs, metrics = _turns(srv, 3)
    assert all(t["forced"] for o in outs for t in o["turns"])
    assert 'polyturn_explorations_total{arm="v1",result="forced"} 3.0' in metrics
    (rec,) = read_jsonl(tmp_path / "sessions.jsonl")
    for t in rec["turns"]:
        assert t["forced"] and t["explored"]["candidates"] == 3 and t["explored"]["chosen"] is not None
        assert len(t["action_ids"]) == len(t["logprobs"])


def test_confidence_filter_keeps_the_greedy_answer(checkpoints):
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])],
                      explore=ExploreSettings(epsilon=1.0, candidates=3, min_mean_logprob=1.0))  # nothing passes
    with RunningServer(create_app(cfg)) as srv:
        outs, metrics = _turns(srv, 2)
    assert not any(t["forced"] for o in outs for t in o["turns"])
    assert 'polyturn_explorations_total{arm="v1",result="kept_greedy"} 2.0' in metrics
