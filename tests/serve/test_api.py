"""The real server on a loopback port, driven with httpx and the official openai client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from polyturn.serve.app import create_app
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import ACTION, ADMIN_TOKEN, RunningServer

pytestmark = pytest.mark.xdist_group("serve_api")  # one test process builds the module fixtures, once


@pytest.fixture(scope="module")
def server(checkpoints, data_dir, tmp_path_factory):
    rec = tmp_path_factory.mktemp("record")
    cfg = ServeConfig(checkpoints=[str(c) for c in checkpoints], record_dir=str(rec), data_dir=str(data_dir),
                      admin_token=ADMIN_TOKEN, max_body_bytes=20_000, max_message_chars=2000, max_sessions=8)
    with RunningServer(create_app(cfg)) as srv:
        srv.record_dir = rec
        yield srv


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_models_and_health(client):
    r = client.get("/v1/models")
    assert r.status_code == 200
    ids = [m["id"] for m in r.json()["data"]]
    assert ids == ["auto", "v1", "v2"]
    assert client.get("/health").json()["versions"] == ["v1", "v2"]


def test_openai_client_chat_completion_and_stream(server):
    oc = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    out = oc.chat.completions.create(model="v1", messages=[{"role": "user", "content": "hello"}])
    assert out.choices[0].message.content.startswith(ACTION)
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens > 3
    pieces = []
    stream = oc.chat.completions.create(model="v1", messages=[{"role": "user", "content": "hello"}], stream=True)
    finish = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert len(pieces) > 3  # token by token
    assert "".join(pieces) == out.choices[0].message.content
    assert finish == "stop"


def test_openai_tool_call_round_trip(server):
    oc = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    tools = [{"type": "function", "function": {"name": "list_tables", "description": "List the tables.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    msgs = [{"role": "user", "content": "hello"}]
    out = oc.chat.completions.create(model="v1", messages=msgs, tools=tools)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "list_tables" and json.loads(call.function.arguments) == {}
    assert choice.message.content == "inspect the schema first."
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "Tables: sales"}]
    again = oc.chat.completions.create(model="v1", messages=msgs, tools=tools)
    assert again.choices[0].message.tool_calls[0].function.name == "list_tables"


def test_chat_session_keeps_its_row_and_sessions_are_isolated(client):
    a = client.post("/v1/sessions", json={"model": "v1"}).json()
    b = client.post("/v1/sessions", json={"model": "v1"}).json()
    assert a["id"] != b["id"] and a["kind"] == "chat"
    ra = client.post(f"/v1/sessions/{a['id']}/turns", json={"message": "hello"})
    assert ra.status_code == 200, ra.text
    assert ra.json()["turns"][0]["action"].startswith(ACTION)
    rb = client.post(f"/v1/sessions/{b['id']}/turns", json={"message": "华东"}).json()
    sa = client.get(f"/v1/sessions/{a['id']}").json()
    sb = client.get(f"/v1/sessions/{b['id']}").json()
    assert [m["content"] for m in sa["messages"]][0] == "hello"
    assert [m["content"] for m in sb["messages"]][0] == "华东"
    assert "华东" not in json.dumps(sa) and "hello" not in json.dumps(sb)
    assert rb["session"]["turns"] == 1
    for s in (a, b):
        assert client.delete(f"/v1/sessions/{s['id']}").status_code == 200
        r = client.get(f"/v1/sessions/{s['id']}")
        assert r.status_code == 404 and "expired" in r.json()["error"]["message"]


def test_env_session_runs_tools_and_metrics(client):
    s = client.post("/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": 3, "model": "v2",
                                          "database": "shop.db"}).json()
    assert s["kind"] == "env" and s["question"]
    r = client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 2}).json()
    assert r["turns"][0]["tool"] == "list_tables" and "sales" in r["turns"][0]["observation"]
    assert r["turns"][1]["error"] == "repeat"
    text = client.get("/metrics").text
    assert 'polyturn_request_latency_seconds_count{arm="v2",endpoint="session_turn"}' in text
    assert 'polyturn_active_sessions{arm="v2"} 1.0' in text
    client.delete(f"/v1/sessions/{s['id']}")


def _prompt_tokens(client) -> float:
    text = client.get("/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("polyturn_tokens_total{") and 'kind="prompt"' in line)


def test_session_bound_completions_prefill_only_new_messages(server, client):
    oc = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    tools = [{"type": "function", "function": {"name": "list_tables", "parameters": {"type": "object"}}}]
    sid = client.post("/v1/sessions", json={"model": "v1"}).json()["id"]
    msgs = [{"role": "user", "content": "Which 3 products had the highest revenue in East China in 2024-Q3?"}]
    first = oc.chat.completions.create(model="v1", messages=msgs, tools=tools, extra_body={"session_id": sid})
    call = first.choices[0].message.tool_calls[0]
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "Tables: sales"}]
    before = _prompt_tokens(client)
    second = oc.chat.completions.create(model="v1", messages=msgs, tools=tools, extra_body={"session_id": sid})
    added = _prompt_tokens(client) - before
    assert 0 < added < second.usage.prompt_tokens / 2  # only the tool result was prefilled, not the history
    # The same conversation without a session (whole context prefilled) gets the same greedy answer.
    alone = oc.chat.completions.create(model="v1", messages=msgs, tools=tools)
    assert alone.choices[0].message.tool_calls[0].function == second.choices[0].message.tool_calls[0].function
    assert alone.usage.prompt_tokens == second.usage.prompt_tokens
    state = client.get(f"/v1/sessions/{sid}").json()
    assert state["turns"] == 2
    client.delete(f"/v1/sessions/{sid}")


def test_recorded_sessions_feed_the_evaluation_metrics(server, client):
    from polyturn.acting.jsonl import read_jsonl
    from polyturn.eval.metrics import compute_metrics, episode_stats

    s = client.post("/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": 11, "model": "v1",
                                          "database": "shop.db"}).json()
    client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 2})
    client.delete(f"/v1/sessions/{s['id']}")
    recs = [r for r in read_jsonl(server.record_dir / "sessions.jsonl") if r["session_id"] == s["id"]]
    metrics = compute_metrics([episode_stats(r) for r in recs], n_boot=10)
    assert metrics.values["latency_p50"].value > 0  # the served turns' latency, as evaluation reports it
    assert metrics.values["success_rate"].value == 0.0


def test_session_bound_completions_record_one_episode_per_conversation(server, client):
    """Messages that extend the session's conversation add to its episode; any others (a retry, a new
    conversation) start it over, and the turns so far are recorded as their own episode (end_reason restart)."""
    from polyturn.acting.jsonl import read_jsonl

    sid = client.post("/v1/sessions", json={"model": "v1"}).json()["id"]
    msgs = [{"role": "user", "content": "hello"}]

    def complete(messages):
        r = client.post("/v1/chat/completions", json={"model": "v1", "messages": messages, "session_id": sid})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]

    msgs += [complete(msgs), {"role": "user", "content": "Tables: sales"}]
    complete(msgs)  # extends the conversation: the same episode
    complete(msgs[:1])  # the first request again (a retry): a new episode
    complete([{"role": "user", "content": "华东"}])  # another conversation: a new episode
    assert client.get(f"/v1/sessions/{sid}").json()["turns"] == 1
    client.delete(f"/v1/sessions/{sid}")
    recs = [r for r in read_jsonl(server.record_dir / "sessions.jsonl") if r["session_id"] == sid]
    assert [[t["observation"] for t in r["turns"]] for r in recs] == [["hello", "Tables: sales"], ["hello"], ["华东"]]
    assert [r["end_reason"] for r in recs] == ["restart", "restart", "closed"]


def test_session_bound_completion_samples_at_the_session_temperature(server, client, checkpoints):
    """Without a request temperature a session-bound completion samples at the session's (2.0 here), the one its
    record reports: the recorded log-probs are those of the temperature-2 distribution."""
    import torch

    from polyturn.acting.jsonl import read_jsonl
    from polyturn.models.actor import load_actor

    sid = client.post("/v1/sessions", json={"model": "v1", "temperature": 2.0}).json()["id"]
    r = client.post("/v1/chat/completions", json={"model": "v1", "session_id": sid,
                                                  "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    client.delete(f"/v1/sessions/{sid}")
    rec = next(x for x in read_jsonl(server.record_dir / "sessions.jsonl") if x["session_id"] == sid)
    assert rec["temperature"] == 2.0
    turn = rec["turns"][0]
    actor = load_actor(checkpoints[0] / "actor")
    prefix = actor.encode(actor.chat.render_prefix("hello", None))
    ids = prefix + turn["action_ids"]
    with torch.no_grad():
        lp = (actor.model(input_ids=torch.tensor([ids])).logits[0] / 2.0).log_softmax(-1)
    want = [float(lp[j - 1, ids[j]]) for j in range(len(prefix), len(ids))]
    assert max(abs(a - b) for a, b in zip(turn["logprobs"], want)) < 1e-3


def test_stream_include_usage_sends_the_usage_chunk(server):
    """``stream_options: {"include_usage": true}``: a last chunk with no choices carries the usage, as OpenAI's."""
    oc = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "hello"}]
    whole = oc.chat.completions.create(model="v1", messages=msgs)
    chunks = list(oc.chat.completions.create(model="v1", messages=msgs, stream=True,
                                             stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(oc.chat.completions.create(model="v1", messages=msgs, stream=True))
    assert all(c.usage is None and c.choices for c in plain)
