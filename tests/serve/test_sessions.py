"""Session expiry, heartbeats, reset, isolation under concurrency, and recording sessions as training data."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from polyturn.acting.jsonl import read_jsonl
from polyturn.models.actor import load_actor
from polyturn.rollout.context import RolloutSettings, demo_segments
from polyturn.serve.app import create_app
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import RunningServer

TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def server(checkpoints, data_dir, tmp_path_factory):
    rec = tmp_path_factory.mktemp("record")
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], record_dir=str(rec), data_dir=str(data_dir),
                      session_timeout_s=TIMEOUT_S, reap_every_s=0.1, max_sessions=8)
    with RunningServer(create_app(cfg)) as srv:
        srv.record_dir = rec
        yield srv


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_idle_session_expires_and_its_state_is_cleared(server, client):
    s = client.post("/v1/sessions", json={}).json()
    kept = client.post("/v1/sessions", json={}).json()
    assert client.post(f"/v1/sessions/{s['id']}/turns", json={"message": "hello"}).status_code == 200
    engines = client.get("/health").json()["engines"]["v1"]
    assert engines["leased"] == 2
    t0 = time.time()
    while time.time() - t0 < TIMEOUT_S + 1.5:  # heartbeats keep one alive past the timeout
        assert client.post(f"/v1/sessions/{kept['id']}/heartbeat").status_code == 200
        time.sleep(0.3)
    r = client.post(f"/v1/sessions/{s['id']}/turns", json={"message": "hello"})
    assert r.status_code == 404 and "expire" in r.json()["error"]["message"]
    assert client.get(f"/v1/sessions/{kept['id']}").status_code == 200
    health = client.get("/health").json()
    assert health["sessions"] == 1 and health["engines"]["v1"]["leased"] == 1  # the expired row was released
    metrics = client.get("/metrics").text
    assert 'polyturn_sessions_closed_total{arm="v1",reason="expired"}' in metrics
    client.delete(f"/v1/sessions/{kept['id']}")
    recs = read_jsonl(server.record_dir / "sessions.jsonl")
    expired = [x for x in recs if x["session_id"] == s["id"]]
    assert len(expired) == 1 and expired[0]["end_reason"] == "expired"


def test_concurrent_sessions_never_see_each_others_state(client, server):
    words = ["hello", "华东", "product | v\nRice | 99887", "Action: describe_table"]
    ids = [client.post("/v1/sessions", json={}).json()["id"] for _ in words]

    def talk(i):
        with httpx.Client(base_url=server.url, timeout=30) as c:
            outs = []
            for k in range(3):
                msg = f"{words[i]} #{k}"
                r = c.post(f"/v1/sessions/{ids[i]}/turns", json={"message": msg})
                assert r.status_code == 200, r.text
                outs.append(r.json())
            return outs

    with concurrent.futures.ThreadPoolExecutor(len(words)) as ex:
        results = list(ex.map(talk, range(len(words))))
    for i, outs in enumerate(results):
        msgs = [m["content"] for m in outs[-1]["session"]["messages"] if m["role"] in ("task", "obs")]
        assert msgs == [f"{words[i]} #{k}" for k in range(3)]
    # Each conversation's greedy replies equal those of the same conversation served alone afterwards.
    for i, outs in enumerate(results):
        solo = client.post("/v1/sessions", json={}).json()["id"]
        alone = [client.post(f"/v1/sessions/{solo}/turns", json={"message": f"{words[i]} #{k}"}).json()["turns"][0]
                 for k in range(3)]
        assert [t["action"] for t in alone] == [o["turns"][0]["action"] for o in outs]
        client.delete(f"/v1/sessions/{solo}")
    batch = client.get("/metrics").text
    # Some decode steps served more than one session at once.
    count_1 = float(batch.split('polyturn_decode_batch_rows_bucket{arm="v1",le="1.0"} ')[1].split()[0])
    total = float(batch.split('polyturn_decode_batch_rows_count{arm="v1"} ')[1].split()[0])
    assert total > count_1
    for sid in ids:
        client.delete(f"/v1/sessions/{sid}")


def test_env_session_reset_feedback_and_recording_reads_back_as_training_data(server, client, checkpoints):
    s = client.post("/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": 5, "database": "shop.db"}).json()
    r = client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 3}).json()
    assert len(r["turns"]) == 3
    assert client.post(f"/v1/sessions/{s['id']}/feedback", json={"rating": 2, "comment": "loops"}).status_code == 200
    r2 = client.post(f"/v1/sessions/{s['id']}/reset", json={"seed": 6}).json()
    assert r2["turns"] == 0 and r2["id"] == s["id"]
    client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 1})
    client.post(f"/v1/sessions/{s['id']}/feedback", json={"outcome": "failure"})
    assert client.delete(f"/v1/sessions/{s['id']}").json()["recorded"] is True
    recs = [x for x in read_jsonl(server.record_dir / "sessions.jsonl") if x["session_id"] == s["id"]]
    assert [x["end_reason"] for x in recs] == ["reset", "closed"]
    first, second = recs
    assert first["seed"] == 5 and second["seed"] == 6 and first["task_id"] != second["task_id"]
    assert first["feedback"][0]["rating"] == 2 and second["feedback"][0]["outcome"] == "failure"
    assert first["policy_version"] == "v1" and first["env_id"] == "polyturn/SQLAnalyst-v0"
    for key in ("env_id", "seed", "task_id", "policy", "success", "return", "level", "ambiguous", "question",
                "privileged", "key_actions", "turns", "final_observation"):
        assert key in first
    t0 = first["turns"][0]
    assert t0["observation"] == first["question"] and t0["info"]["action_type"] == "list_tables"
    assert t0["reward_terms"] and abs(sum(t0["reward_terms"].values()) - t0["reward"]) < 1e-9
    assert len(t0["action_ids"]) == len(t0["logprobs"]) == t0["n_tokens"] and t0["latency_s"] > 0
    # Training reads the record as it is: BC segments with the rollout's context policy.
    actor = load_actor(checkpoints[0] / "actor")
    segs = demo_segments(actor, RolloutSettings(max_action_tokens=24, context_budget=512), first)
    ids = segs[0].ids
    acted = [i for i, m in zip(ids, segs[0].action_mask) if m]
    assert acted == sum((t["action_ids"] for t in first["turns"]), [])  # the served ids, token for token
    # The served log-probs are the policy's: recompute them from the segment.
    import torch

    with torch.no_grad():
        lp = actor.model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
    pos = [j for j, m in enumerate(segs[0].action_mask) if m]
    served = sum((t["logprobs"] for t in first["turns"]), [])
    for j, want in zip(pos, served):
        assert abs(float(lp[j - 1, ids[j]]) - want) < 1e-3


def test_train_reads_recorded_sessions(server, client, tmp_path):
    """``polyturn train --set bc.demos=<record>`` loads the served records (BC on them, a few updates)."""
    from polyturn.config import load_config
    from polyturn.train.setup import load_or_make_demos

    s = client.post("/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": 9, "database": "shop.db"}).json()
    client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 2})
    client.delete(f"/v1/sessions/{s['id']}")
    path = server.record_dir / "sessions.jsonl"
    cfg = load_config(None, [f"bc.demos={path}"])
    demos = load_or_make_demos(cfg, tmp_path)
    assert any(d["session_id"] == s["id"] for d in demos)


def test_long_conversation_follows_the_context_budget(server, client):
    """Past rollout.context_budget (512 here) the context is rebuilt as in rollouts and the row starts over."""
    sid = client.post("/v1/sessions", json={}).json()["id"]
    for k in range(12):
        msg = f"turn {k}: " + "product | v\nRice | 99887\n" * 4
        r = client.post(f"/v1/sessions/{sid}/turns", json={"message": msg})
        assert r.status_code == 200, r.text
    health = client.get("/health").json()["engines"]["v1"]
    assert health["leased"] >= 1
    service = server.app.state.service
    s = service.store.get(sid)
    assert len(s.state.conv.segments) > 1 and len(s.state.conv.seg.ids) <= 512
    eng = service.versions["v1"].engine
    assert len(eng.hist[s.slot.row]) == len(s.state.conv.seg.ids)  # the row holds exactly the current segment
    client.delete(f"/v1/sessions/{sid}")


def test_full_server_answers_503_and_recovers(server, client):
    ids = []
    while True:
        r = client.post("/v1/sessions", json={})
        if r.status_code != 200:
            break
        ids.append(r.json()["id"])
        assert len(ids) <= 8
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["error"]["message"]
    for sid in ids:
        client.delete(f"/v1/sessions/{sid}")
    r = client.post("/v1/sessions", json={})
    assert r.status_code == 200
    client.delete(f"/v1/sessions/{r.json()['id']}")


def test_message_longer_than_the_context_is_400_and_the_session_stays_usable(client):
    """A message within --max-message-chars whose tokens cannot fit rollout.context_budget (512, minus the action's
    24) is a 400 naming the limit, and the session answers its next message as if the long one was never sent."""
    long = " ".join(f"w{k}x{k * 7 % 13}" for k in range(700))
    assert len(long) < 8000  # within --max-message-chars: only the token budget refuses it
    sid = client.post("/v1/sessions", json={}).json()["id"]
    for _ in range(2):
        r = client.post(f"/v1/sessions/{sid}/turns", json={"message": long})
        assert r.status_code == 400 and "at most 488 tokens" in r.json()["error"]["message"], r.text
    r = client.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"})
    assert r.status_code == 200, r.text
    assert [m["content"] for m in r.json()["session"]["messages"] if m["role"] == "task"] == ["hello"]
    r = client.post("/v1/chat/completions", json={"model": "v1", "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and "at most 488 tokens" in r.json()["error"]["message"], r.text
    client.delete(f"/v1/sessions/{sid}")


def test_failed_reset_keeps_the_episode_unrecorded(server, client):
    """A reset to a bad task_id is a 400 that leaves the episode as it was: its turns stay, nothing is recorded,
    and the episode is recorded whole when the session closes."""
    s = client.post("/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": 3, "database": "shop.db"}).json()
    client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 2})
    r = client.post(f"/v1/sessions/{s['id']}/reset", json={"task_id": "nope"})
    assert r.status_code == 400 and "task_id" in r.json()["error"]["message"]
    after = client.get(f"/v1/sessions/{s['id']}").json()
    assert after["turns"] == 2 and after["task_id"] == s["task_id"]
    client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 1})
    client.delete(f"/v1/sessions/{s['id']}")
    recs = [x for x in read_jsonl(server.record_dir / "sessions.jsonl") if x["session_id"] == s["id"]]
    assert [(x["end_reason"], len(x["turns"])) for x in recs] == [("closed", 3)]
    assert recs[0]["turns"][0]["observation"] == s["question"]


def test_sessions_expire_even_when_their_records_cannot_be_written(checkpoints, tmp_path):
    """A record that cannot be written (here the record file is a directory) must not stop the reaper."""
    rec = tmp_path / "record"
    (rec / "sessions.jsonl").mkdir(parents=True)
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], record_dir=str(rec), session_timeout_s=0.5,
                      reap_every_s=0.1)
    with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        ids = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(2)]
        for sid in ids:
            assert c.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"}).status_code == 200
        time.sleep(1.5)
        assert c.get("/health").json()["engines"]["v1"]["leased"] == 0  # both expired, rows released
        later = c.post("/v1/sessions", json={}).json()["id"]
        assert c.post(f"/v1/sessions/{later}/turns", json={"message": "hello"}).status_code == 200
        time.sleep(1.5)
        assert c.get(f"/v1/sessions/{later}").status_code == 404  # the reaper is still running
