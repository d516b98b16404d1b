"""Off-policy evaluation on sessions recorded by a real `polyturn serve`: a policy on its own records weighs 1,
another policy does not, and records without behaviour log-probs are refused with a clear message."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.ope import OPEError, check_records, estimate, record_segments, turn_logprobs
from polyturn.models.actor import load_actor
from polyturn.serve.app import create_app
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import RunningServer, make_checkpoint

SQL = "polyturn/SQLAnalyst-v0"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_tokenizer):
    """Two checkpoints, and sessions v1 served at temperature 1: environment sessions of up to 3 turns and
    chat completions whose conversation starts over (a context restart inside one session)."""
    root = tmp_path_factory.mktemp("ope")
    ckpts = [make_checkpoint(root, tiny_tokenizer, name=f"v{k + 1}", seed=k, steps=30) for k in range(2)]
    from polyturn.envs.sql.database import write_sales_db

    data = root / "data"
    data.mkdir()
    write_sales_db(data / "shop.db", 0)
    rec = root / "rec"
    cfg = ServeConfig(checkpoints=[str(c) for c in ckpts], record_dir=str(rec), data_dir=str(data), max_sessions=8)
    with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        for seed in range(6):
            s = c.post("/v1/sessions", json={"env": SQL, "seed": seed, "model": "v1", "temperature": 1.0,
                                             "database": "shop.db"}).json()
            c.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 3})
            c.delete(f"/v1/sessions/{s['id']}")
        sid = c.post("/v1/sessions", json={"model": "v1", "temperature": 1.0}).json()["id"]
        msgs = [{"role": "user", "content": "hello"}]
        msg = c.post("/v1/chat/completions", json={"model": "v1", "messages": msgs, "session_id": sid}).json()
        msgs += [msg["choices"][0]["message"], {"role": "user", "content": "Tables: sales"}]
        c.post("/v1/chat/completions", json={"model": "v1", "messages": msgs, "session_id": sid})
        c.delete(f"/v1/sessions/{sid}")
    return ckpts, list(read_jsonl(rec / "sessions.jsonl"))


def test_a_policy_on_its_own_records_weighs_one(recorded):
    ckpts, records = recorded
    assert len(records) == 7 and sum(len(r["turns"]) for r in records) >= 8
    assert any(len(record_segments(r)) == 1 and len(r["turns"]) > 1 for r in records)  # contexts that grow
    actor = load_actor(ckpts[0] / "actor")
    new = turn_logprobs(actor, records)
    old = [np.array([sum(t["logprobs"]) for t in r["turns"]]) for r in records]
    ratios = np.exp(np.concatenate(new) - np.concatenate(old))
    np.testing.assert_allclose(ratios, 1.0, atol=1e-4)
    rep = estimate(actor, records, policy="v1", n_resamples=200)
    assert rep.ess == pytest.approx(len(records), rel=1e-3)
    assert rep.wis["return"].value == pytest.approx(rep.recorded["return"], abs=1e-3)
    assert rep.wis["success"].value == pytest.approx(rep.recorded["success"], abs=1e-6)
    assert rep.wis["return"].lo <= rep.wis["return"].value <= rep.wis["return"].hi
    assert rep.dr is None and "no critic" in rep.dr_unavailable


def test_another_policy_on_the_records_does_not(recorded):
    ckpts, records = recorded
    rep = estimate(load_actor(ckpts[1] / "actor"), records, policy="v2", n_resamples=200)
    assert rep.mean_abs_log_ratio > 0.05
    assert rep.ess < len(records)


def test_records_without_behaviour_logprobs_are_refused(recorded):
    _, records = recorded
    stripped = [{**r, "turns": [{k: v for k, v in t.items() if k not in ("logprobs", "action_ids")}
                                for t in r["turns"]]} for r in records]
    with pytest.raises(OPEError, match="Expected behaviour log-probs on every turn.*7 of 7 episodes"):
        check_records(stripped, source="eval.jsonl")
    greedy = [{**r, "turns": [{**t, "temperature": 0.0} for t in r["turns"]]} for r in records]
    with pytest.raises(OPEError, match="Expected sampled sessions"):
        check_records(greedy, source="x")
    old = [{**r, "turns": [{k: v for k, v in t.items() if k != "context_ids"} for t in r["turns"]]} for r in records]
    with pytest.raises(OPEError, match="record the sessions again"):
        check_records(old, source="x")
