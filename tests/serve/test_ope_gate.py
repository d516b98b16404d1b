"""The ramp's off-policy gate on a real server: a version estimated worse on the incumbent's recorded sessions is
refused past 20% (routing event, admin API message, log); one estimated better ramps to 100%.

The incumbent answers a SQL task with a valid tool call (reward +0.06) or with text that does not parse (-0.21),
about half and half; the better version makes the valid call about 90% of the time, the worse one the bad text.
The incumbent is a tiny model trained for seconds towards its mixture, the other two the incumbent trained a few
steps more towards theirs, so all three put weight on both answers and importance sampling on the incumbent's
sessions can tell them apart.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest
import torch

from polyturn.serve.app import create_app
from polyturn.serve.ope_gate import OPEGateSettings
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import ACTION, ADMIN_TOKEN, RunningServer, fit_and_save

pytestmark = pytest.mark.xdist_group("serve_ope_gate")  # one test process builds the module fixtures, once

BAD = "I cannot help with that."
SQL = "polyturn/SQLAnalyst-v0"
N_SESSIONS = 40
HEADERS = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def mixture_checkpoint(root: Path, tokenizer, *, name: str, p_good: float, tasks: list[str], steps: int,
                       start: Path | None = None) -> Path:
    """A checkpoint whose actor answers ``tasks`` with ``ACTION`` with probability about ``p_good``, else ``BAD``
    (cross-entropy towards that mixture: its optimum), trained from scratch or from the checkpoint ``start``."""
    from polyturn.models.actor import load_actor, tiny_actor

    actor = load_actor(start / "actor") if start else tiny_actor(tokenizer, hidden=32, layers=2, heads=4, seed=0)
    opt = torch.optim.Adam(actor.model.parameters(), lr=2e-2)
    seqs, masks, weights = [], [], []
    for task in tasks:
        prefix = actor.encode(actor.chat.render_prefix(task, None))
        for text, w in ((ACTION, p_good), (BAD, 1 - p_good)):
            act = actor.encode(text) + [actor.stop_id]
            seqs.append(prefix + act)
            masks.append([0] * len(prefix) + [1] * len(act))
            weights.append(w)
    return fit_and_save(actor, opt, seqs, masks, weights=weights, steps=steps, ckpt=root / name,
                        overrides=["rollout.max_action_tokens=24", "rollout.context_budget=512"])


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_tokenizer, data_dir):
    from polyturn.acting.registry import env_spec, make_env

    root = tmp_path_factory.mktemp("gate")
    env = make_env(SQL, {env_spec(SQL).data_files["database"]: str(data_dir / "shop.db")}).unwrapped
    tasks = [env.reset(seed=seed)[0] for seed in range(8)]  # like the sessions' first messages (seeds 0-39)
    env.close()
    incumbent = mixture_checkpoint(root, tiny_tokenizer, name="incumbent", p_good=0.5, tasks=tasks, steps=60)
    ckpts = [incumbent] + [mixture_checkpoint(root, tiny_tokenizer, name=n, p_good=p, tasks=tasks, steps=15,
                                              start=incumbent) for n, p in (("better", 0.9), ("worse", 0.1))]
    cfg = ServeConfig(checkpoints=[str(c) for c in ckpts], record_dir=str(root / "rec"), data_dir=str(data_dir),
                      admin_token=ADMIN_TOKEN, reap_every_s=0.05,
                      ope=OPEGateSettings(margin=0.05, metric="return", min_sessions=20, resamples=500))
    with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        for seed in range(N_SESSIONS):  # the incumbent's sessions, recorded: one turn each, at temperature 1
            s = c.post("/v1/sessions", json={"env": SQL, "seed": seed, "model": "incumbent",
                                             "temperature": 1.0, "database": "shop.db"}).json()
            c.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 1})
            c.delete(f"/v1/sessions/{s['id']}")
        srv.client = c
        yield srv


def ramp_until_settled(c: httpx.Client, version: str) -> dict:
    r = c.post("/admin/routing/ramp", json={"version": version, "dwell_s": 0, "min_samples": 0}, headers=HEADERS)
    assert r.status_code == 200, r.text
    deadline = time.time() + 60
    while True:
        ramp = c.get("/admin/routing", headers=HEADERS).json()["ramp"]
        if ramp["status"] != "running":
            return ramp
        assert time.time() < deadline, ramp
        time.sleep(0.05)


def test_the_gate_refuses_a_worse_version_and_says_why(server, caplog):
    c = server.client
    recs = server.app.state.service.ope_gate.records("incumbent")[0]
    returns = sorted({round(r["return"], 2) for r in recs})
    assert len(recs) == N_SESSIONS and {-0.21, 0.06} <= set(returns)  # both answers were served
    with caplog.at_level(logging.WARNING, logger="polyturn.serve.routing"):
        ramp = ramp_until_settled(c, "worse")
    assert ramp["status"] == "stopped" and ramp["share"] == 0.0, str(ramp)
    assert ramp["reason"].startswith("refused past 20%: worse's off-policy return lower bound")
    assert "below incumbent's" in ramp["reason"]
    gate = ramp["gate"]
    assert gate["status"] == "failed" and gate["lower"] < gate["incumbent"] - 0.05 and gate["sessions"] == 40
    assert gate["estimate"] < gate["incumbent"]
    events = [e["event"] for e in c.get("/admin/routing", headers=HEADERS).json()["events"]]
    assert events[-3:] == ["ope_gate_start", "ope_gate_failed", "ramp_stopped"]
    assert any("below incumbent's" in r.getMessage() for r in caplog.records)
    assert c.get("/admin/routing", headers=HEADERS).json()["shares"] == {"incumbent": 1.0, "better": 0.0,
                                                                          "worse": 0.0}


def test_the_gate_lets_a_better_version_ramp_to_100_percent(server):
    ramp = ramp_until_settled(server.client, "better")
    assert ramp["status"] == "done" and ramp["share"] == 1.0, ramp
    gate = ramp["gate"]
    assert gate["status"] == "passed" and gate["estimate"] > gate["incumbent"]
    assert "at or above incumbent's" in gate["message"]


def test_the_gates_rule_its_session_floor_and_its_dr_fallback(server):
    """The check itself (as the router runs it): the margin decides; too few usable sessions refuse with a count;
    doubly robust asked of a checkpoint without a separate critic falls back to WIS and says so."""
    from polyturn.serve.ope_gate import OPEGate

    service = server.app.state.service
    record_dir = service.config.record_dir

    def gate(**kw) -> OPEGate:
        settings = OPEGateSettings(**{"margin": 0.05, "metric": "return", "resamples": 200, **kw})
        return OPEGate(settings, record_dir=record_dir, checkpoint=lambda name: service.versions[name].path)

    strict, lenient = gate()("worse", "incumbent"), gate(margin=1.0)("worse", "incumbent")
    assert not strict.passed and lenient.passed  # the same estimate, another margin
    assert strict.details["lower"] == pytest.approx(lenient.details["lower"])
    assert lenient.details["lower"] >= lenient.details["incumbent"] - 1.0
    few = gate(min_sessions=41)("worse", "incumbent")
    assert not few.passed and few.message.startswith("40 usable recorded sessions of incumbent (40 recorded")
    assert "expected at least 41" in few.message
    dr = gate(estimator="dr")("better", "incumbent")
    assert "per-decision WIS (doubly robust unavailable:" in dr.message and "holds no critic" in dr.message
    assert gate()("better", "nobody").message.startswith("0 usable recorded sessions of nobody")
