"""Serving a hierarchical checkpoint: a real server on a loopback port with both policies of a tiny hierarchical
checkpoint behind each session, driven by the official openai client and httpx.

The checkpoint (``tests.serve.conftest.hierarchical_checkpoint``) was trained on scripted games of the SQL
analyst's tasks 0-7: its manager always sets the subgoal ``inspect``; its worker writes ``list_tables`` under a new
subgoal and ``subgoal_done`` after a tool's result. Tasks 1 and 3 were played with k 2 (a done ends each subgoal),
the even ones with k 1 (the manager sets the next subgoal after each worker turn), so the tests use those.
"""

from __future__ import annotations

import json
import shutil

import httpx
import openai
import pytest

from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.registry import make_env
from polyturn.serve.app import create_app
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import ADMIN_TOKEN, LIST_TABLES, SET_INSPECT, SUBGOAL_DONE, RunningServer

pytestmark = pytest.mark.xdist_group("serve_hierarchy")  # with tests/acting/test_hierarchy_checkpoint.py: one checkpoint
SQL = "polyturn/SQLAnalyst-v0"
INSPECT = "Inspect the schema of the tables the question needs."
TOOLS = [{"type": "function", "function": {"name": "list_tables", "description": "List the tables.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def task_and_tables(seed: int) -> tuple[str, str]:
    """Task ``seed``'s question and what list_tables answers in it, as a client that runs the tools would send."""
    env = make_env(SQL, {"max_turns": 2})
    question, _ = env.reset(seed=seed)
    tables = env.step(LIST_TABLES)[0]
    env.close()
    return question, tables


@pytest.fixture(scope="module")
def server(hierarchical_ckpt, tmp_path_factory):
    """Versions ``h`` (k 2, as trained) and ``h1`` (the same weights with k 1) on one server, recording."""
    root = tmp_path_factory.mktemp("hserve")
    k1 = root / "h1"
    shutil.copytree(hierarchical_ckpt, k1)
    cfg_file = k1 / "config.yaml"
    cfg_file.write_text(cfg_file.read_text().replace("  k: 2\n", "  k: 1\n"))
    assert "  k: 1\n" in cfg_file.read_text()
    cfg = ServeConfig(checkpoints=[str(hierarchical_ckpt), str(k1)], record_dir=str(root / "rec"), max_sessions=4,
                      admin_token=ADMIN_TOKEN, checkpoint_dirs=[str(root)])
    with RunningServer(create_app(cfg)) as srv:
        srv.root, srv.record_dir = root, root / "rec"
        srv.names = (hierarchical_ckpt.name, k1.name)
        yield srv


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def records(server, sid: str) -> list[dict]:
    return [r for r in read_jsonl(server.record_dir / "sessions.jsonl") if r["session_id"] == sid]


def test_a_session_bound_completion_hides_subgoal_done_asks_the_manager_and_shows_the_subgoal(server, client):
    """The worker's ``subgoal_done[]`` after the tool's result never reaches the client: the manager sets the next
    subgoal and the worker, sampled again, calls the tool. The subgoals are in the response, the session's state and
    the recorded episode, with the manager's turns and the hidden one."""
    name = server.names[0]
    question, tables = task_and_tables(1)
    oc = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    sid = client.post("/v1/sessions", json={"model": name}).json()["id"]
    msgs = [{"role": "user", "content": question}]
    first = oc.chat.completions.create(model=name, messages=msgs, tools=TOOLS, extra_body={"session_id": sid})
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.tool_calls[0].function.name == "list_tables"
    assert first.model_extra["subgoal"]["name"] == "inspect" and first.model_extra["subgoal"]["text"] == INSPECT
    state = client.get(f"/v1/sessions/{sid}").json()
    assert state["hierarchy"]["manager_turns"] == 1 and len(state["hierarchy"]["subgoals"]) == 1
    assert state["messages"][0]["content"] == f"{question}\nSubgoal: {INSPECT}"  # the worker's context

    call = first.choices[0].message.tool_calls[0]
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": tables}]
    second = oc.chat.completions.create(model=name, messages=msgs, tools=TOOLS, extra_body={"session_id": sid})
    assert second.choices[0].message.tool_calls[0].function.name == "list_tables"
    assert "subgoal_done" not in json.dumps(second.model_dump())
    state = client.get(f"/v1/sessions/{sid}").json()
    # The sent call counts once the client's answer steps it: 0 turns on the second subgoal so far.
    assert [(g["name"], g["end"], g["turns"]) for g in state["hierarchy"]["subgoals"]] == [
        ("inspect", "done", 2), ("inspect", None, 0)]
    assert state["hierarchy"]["subgoal"] == state["hierarchy"]["subgoals"][1] and state["turns"] == 3
    assert [m["content"] for m in state["messages"][1:]] == [LIST_TABLES, tables, SUBGOAL_DONE,
                                                             f"Subgoal: {INSPECT}", LIST_TABLES]

    assert client.delete(f"/v1/sessions/{sid}").json()["recorded"]
    (rec,) = records(server, sid)
    assert rec["role"] == "worker" and [t["action"] for t in rec["turns"]] == [LIST_TABLES, SUBGOAL_DONE, LIST_TABLES]
    assert [t["info"]["subgoal_index"] for t in rec["turns"]] == [0, 0, 1]
    assert [t["info"].get("hidden", False) for t in rec["turns"]] == [False, True, False]
    assert rec["turns"][1]["observation"] == tables and rec["turns"][2]["observation"] == f"Subgoal: {INSPECT}"
    manager = rec["hierarchy"]["manager_turns"]
    assert [t["action"] for t in manager] == [SET_INSPECT, SET_INSPECT]
    assert manager[0]["observation"] == f"Task: {question}\nSet the first subgoal."
    assert manager[1]["observation"].startswith(f"Worker: {LIST_TABLES}\nResult: {tables}\n")
    assert "the worker says it is done" in manager[1]["observation"]
    assert all(t["action_ids"] and len(t["logprobs"]) == len(t["action_ids"]) for t in manager)
    assert [g["end"] for g in rec["hierarchy"]["subgoals"]] == ["done", None]


def test_after_k_worker_turns_the_manager_sets_the_next_subgoal_and_a_stream_sends_the_call_whole(server, client):
    """Version ``h1`` (k 1): after each tool result the manager is asked again, and the worker reads the result and
    the new subgoal together; a streamed answer comes as one chunk carrying the tool call."""
    name = server.names[1]
    question, tables = task_and_tables(2)
    oc = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    sid = client.post("/v1/sessions", json={"model": name}).json()["id"]
    msgs = [{"role": "user", "content": question}]
    first = oc.chat.completions.create(model=name, messages=msgs, tools=TOOLS, extra_body={"session_id": sid})
    call = first.choices[0].message.tool_calls[0]
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": tables}]
    chunks = list(oc.chat.completions.create(model=name, messages=msgs, tools=TOOLS, stream=True,
                                             extra_body={"session_id": sid}))
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(calls) == 1 and calls[0][0].function.name == "list_tables"
    state = client.get(f"/v1/sessions/{sid}").json()
    assert [(g["end"], g["turns"]) for g in state["hierarchy"]["subgoals"]] == [("k_turns", 1), (None, 0)]
    assert state["messages"][2]["content"] == f"{tables}\nSubgoal: {INSPECT}" and state["turns"] == 2
    client.delete(f"/v1/sessions/{sid}")


def test_a_chat_sessions_turns_keep_the_game_and_a_reset_or_a_new_conversation_starts_a_new_one(server, client):
    """``/turns`` with messages plays the same game as completions do; a reset records it and clears the subgoals;
    completions whose messages do not extend the game's conversation start a new game (the turns so far recorded
    as their own episode)."""
    name = server.names[0]
    question, tables = task_and_tables(1)
    sid = client.post("/v1/sessions", json={"model": name}).json()["id"]
    assert client.get(f"/v1/sessions/{sid}").json()["hierarchy"] == {"subgoal": None, "subgoals": [],
                                                                     "manager_turns": 0}
    r = client.post(f"/v1/sessions/{sid}/turns", json={"message": question}).json()
    assert r["turns"][0]["action"] == LIST_TABLES and r["turns"][0]["subgoal"]["name"] == "inspect"
    r = client.post(f"/v1/sessions/{sid}/turns", json={"message": tables}).json()
    assert r["turns"][0]["action"] == LIST_TABLES and len(r["session"]["hierarchy"]["subgoals"]) == 2
    assert r["session"]["turns"] == 3 and r["session"]["question"] == question
    reset = client.post(f"/v1/sessions/{sid}/reset").json()
    assert reset["hierarchy"]["subgoals"] == [] and reset["turns"] == 0
    msgs = [{"role": "user", "content": question}]
    for _ in range(2):  # the same first message twice: the second does not extend the first's game
        out = client.post("/v1/chat/completions", json={"model": name, "messages": msgs, "session_id": sid}).json()
        assert out["choices"][0]["message"]["content"] == LIST_TABLES and out["subgoal"]["name"] == "inspect"
    client.delete(f"/v1/sessions/{sid}")
    recs = records(server, sid)
    assert [(r["end_reason"], len(r["turns"]), len(r["hierarchy"]["subgoals"])) for r in recs] == [
        ("reset", 3, 2), ("restart", 1, 1), ("closed", 1, 1)]


def test_an_env_session_plays_the_workers_seat_with_the_manager_and_records_the_subgoals(server, client):
    """An environment session of a hierarchical version: the manager sets the first subgoal when the task starts;
    the worker's turns, its ``subgoal_done[]`` included, run the env's tools until the task's two env turns end it."""
    name = server.names[0]
    question, tables = task_and_tables(3)
    s = client.post("/v1/sessions", json={"env": SQL, "seed": 3, "model": name}).json()
    assert s["question"] == question and s["hierarchy"]["subgoal"]["name"] == "inspect"
    assert s["messages"][0]["content"] == f"{question}\nSubgoal: {INSPECT}"
    r = client.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 5}).json()
    assert [t["tool"] for t in r["turns"]] == ["list_tables", "subgoal_done", "list_tables"]
    assert r["turns"][0]["observation"] == tables and r["turns"][1]["observation"] == f"Subgoal: {INSPECT}"
    assert r["session"]["done"] and r["turns"][-1]["truncated"]
    assert [g["end"] for g in r["session"]["hierarchy"]["subgoals"]] == ["done", "game_end"]
    client.delete(f"/v1/sessions/{s['id']}")
    (rec,) = records(server, s["id"])
    assert rec["role"] == "worker" and rec["env_id"] == SQL and rec["seed"] == 3
    assert [t["info"]["subgoal_index"] for t in rec["turns"]] == [0, 0, 1]
    assert len(rec["hierarchy"]["manager_turns"]) == 2 and len(rec["hierarchy"]["subgoals"]) == 2


def test_what_a_hierarchical_version_cannot_serve_is_a_400_with_the_fix(server, client, hierarchical_ckpt):
    from polyturn.config import load_config, save_config

    name = server.names[0]
    r = client.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "session_id" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "POST /v1/sessions" in r.json()["error"]["message"]
    r = client.post("/v1/sessions", json={"env": SQL, "model": name, "role": "first"})
    assert r.status_code == 400 and "no role/partner for a hierarchical version" in r.json()["error"]["message"]
    r = client.post("/v1/sessions", json={"env": "polyturn/Negotiation-v0", "model": name})
    assert r.status_code == 400 and "to offer subgoals" in r.json()["error"]["message"]
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    flat, no_worker = server.root / "flat", server.root / "no_worker"
    for d in (flat, no_worker):
        shutil.copytree(hierarchical_ckpt, d)
    cfg = load_config(flat / "config.yaml")
    cfg.hierarchy = None
    save_config(cfg, flat / "config.yaml")  # the manager's weights as a flat version
    shutil.rmtree(no_worker / "roles")
    r = client.post("/admin/versions", json={"checkpoint": str(flat)}, headers=admin)
    assert r.status_code == 400 and "all hierarchical or all flat" in r.json()["error"]["message"]
    r = client.post("/admin/versions", json={"checkpoint": str(no_worker)}, headers=admin)
    assert r.status_code == 400 and "roles/worker/actor" in r.json()["error"]["message"]
    assert sorted(client.get("/health").json()["engines"]) == sorted(
        [*server.names, *(f"{n}/manager" for n in server.names)])
    assert client.get("/health").json()["sessions"] == 0  # the refused requests left no session behind


def test_serve_refuses_a_hierarchical_checkpoint_without_its_worker_or_beside_a_flat_one(hierarchical_ckpt, tmp_path,
                                                                                       capsys):
    from polyturn.cli import main
    from polyturn.config import load_config, save_config

    broken, flat = tmp_path / "broken", tmp_path / "flat"
    for d in (broken, flat):
        shutil.copytree(hierarchical_ckpt, d)
    shutil.rmtree(broken / "roles")
    cfg = load_config(flat / "config.yaml")
    cfg.hierarchy = None
    save_config(cfg, flat / "config.yaml")
    assert main(["serve", "--checkpoint", str(broken)]) == 2
    assert "worker's actor in" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(hierarchical_ckpt), "--checkpoint", str(flat)]) == 2
    err = capsys.readouterr().err
    assert "all hierarchical or all flat" in err and "Traceback" not in err
