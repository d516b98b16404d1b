"""Malformed, oversize and unauthorised requests get 4xx with a message, never a 500."""

from __future__ import annotations

import json

import httpx
import pytest

from polyturn.serve.app import create_app
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import ADMIN_TOKEN, RunningServer


@pytest.fixture(scope="module")
def server(checkpoints, data_dir):
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], data_dir=str(data_dir), admin_token=ADMIN_TOKEN,
                      max_body_bytes=20_000, max_message_chars=2000, max_messages=50)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


U = [{"role": "user", "content": "hello"}]
CC = "/v1/chat/completions"


def _tool_call(name: str, arguments: str) -> list[dict]:
    """``U``, an assistant message calling ``name(arguments)``, and the tool's result."""
    return U + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                      "function": {"name": name, "arguments": arguments}}]},
                {"role": "tool", "content": "x"}]


def _properties(props) -> list[dict]:
    """A tool whose JSON schema has ``properties`` = ``props``."""
    return [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": props}}}]


MALFORMED = [
    ("invalid JSON", "POST", CC, b'{"model": "v1", "messages": [', None),
    ("JSON array body", "POST", CC, b"[1, 2]", None),
    ("empty body", "POST", CC, b"", None),
    ("missing messages", "POST", CC, {"model": "v1"}, None),
    ("missing model", "POST", CC, {"messages": U}, None),
    ("messages not a list", "POST", CC, {"model": "v1", "messages": "hello"}, None),
    ("empty messages", "POST", CC, {"model": "v1", "messages": []}, None),
    ("unknown role", "POST", CC, {"model": "v1", "messages": [{"role": "wizard", "content": "x"}]}, None),
    ("content of wrong type", "POST", CC, {"model": "v1", "messages": [{"role": "user", "content": 42}]}, None),
    ("temperature as text", "POST", CC, {"model": "v1", "messages": U, "temperature": "hot"}, None),
    ("temperature out of range", "POST", CC, {"model": "v1", "messages": U, "temperature": 7}, None),
    ("n > 1", "POST", CC, {"model": "v1", "messages": U, "n": 3}, None),
    ("max_tokens 0", "POST", CC, {"model": "v1", "messages": U, "max_tokens": 0}, None),
    ("unknown model", "POST", CC, {"model": "gpt-9", "messages": U}, None),
    ("last message from assistant", "POST", CC,
     {"model": "v1", "messages": U + [{"role": "assistant", "content": "hi"}]}, None),
    ("tool message first", "POST", CC, {"model": "v1", "messages": [{"role": "tool", "content": "x"}]}, None),
    ("tool call arguments not JSON", "POST", CC, {"model": "v1", "messages": U + [
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": "{oops"}}]},
        {"role": "tool", "content": "x"}]}, None),
    ("bad tool name", "POST", CC, {"model": "v1", "messages": U, "tools": [
        {"type": "function", "function": {"name": "rm -rf /"}}]}, None),
    ("message too long", "POST", CC, {"model": "v1", "messages": [{"role": "user", "content": "x" * 2001}]}, None),
    ("too many messages", "POST", CC, {"model": "v1", "messages": U * 51}, None),
    ("body too large", "POST", CC, {"model": "v1", "messages": [{"role": "user", "content": "x" * 30_000}]}, None),
    ("unknown session id", "POST", CC, {"model": "v1", "messages": U, "session_id": "sess_nope"}, None),
    ("session unknown field", "POST", "/v1/sessions", {"envv": "x"}, None),
    ("session unknown env", "POST", "/v1/sessions", {"env": "Pong-v5"}, None),
    ("database outside data dir", "POST", "/v1/sessions",
     {"env": "polyturn/SQLAnalyst-v0", "database": "../../etc/passwd"}, None),
    ("absolute database path", "POST", "/v1/sessions", {"env": "polyturn/SQLAnalyst-v0", "database": "/etc/hosts"},
     None),
    ("seed negative", "POST", "/v1/sessions", {"env": "polyturn/SQLAnalyst-v0", "seed": -1}, None),
    ("bad task id", "POST", "/v1/sessions", {"env": "polyturn/SQLAnalyst-v0", "task_id": "nope"}, None),
    ("seed on a chat session", "POST", "/v1/sessions", {"seed": 3}, None),
    ("turn on unknown session", "POST", "/v1/sessions/sess_x/turns", {"message": "hi"}, None),
    ("feedback bad outcome", "POST", "/v1/sessions/sess_x/feedback", {"outcome": "great"}, None),
    ("unknown path", "GET", "/v1/nothing", None, None),
    ("wrong method", "GET", CC, None, None),
    ("admin without token", "GET", "/admin/routing", None, None),
    ("admin wrong token", "GET", "/admin/routing", None, "Bearer wrong-token-wrong-token"),
    ("admin shares unknown version", "POST", "/admin/routing/shares", {"shares": {"v9": 1.0}},
     f"Bearer {ADMIN_TOKEN}"),
    ("admin negative share", "POST", "/admin/routing/shares", {"shares": {"v1": -1.0}}, f"Bearer {ADMIN_TOKEN}"),
    ("admin load outside checkpoint dirs", "POST", "/admin/versions", {"checkpoint": "/etc"},
     f"Bearer {ADMIN_TOKEN}"),
    ("admin ramp to the leading version", "POST", "/admin/routing/ramp", {"version": "v1"}, f"Bearer {ADMIN_TOKEN}"),
    ("admin NaN share", "POST", "/admin/routing/shares", b'{"shares": {"v1": NaN}}', f"Bearer {ADMIN_TOKEN}"),
    ("database not SQLite", "POST", "/v1/sessions", {"env": "polyturn/SQLAnalyst-v0", "database": "notes.txt"},
     None),
    ("tool call arguments nested too deeply", "POST", CC,
     {"model": "v1", "messages": _tool_call("f", "[" * 5000 + "]" * 5000)}, None),
    ("tool call name not a tool name", "POST", CC, {"model": "v1", "messages": _tool_call("list-tables", "{}")},
     None),
    ("lone surrogate in content", "POST", CC,
     b'{"model": "v1", "messages": [{"role": "user", "content": "hi \\ud800"}]}', None),
    ("lone surrogate in tool call arguments", "POST", CC,
     json.dumps({"model": "v1", "messages": _tool_call("f", '{"a": "\\ud800"}')}).encode(), None),
    ("tool parameters.properties a number", "POST", CC, {"model": "v1", "messages": U, "tools": _properties(5)}, None),
    ("tool parameters.properties null", "POST", CC, {"model": "v1", "messages": U, "tools": _properties(None)}, None),
]


@pytest.mark.parametrize("name,method,path,body,auth", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_are_4xx_with_a_message(server, name, method, path, body, auth):
    headers = {"authorization": auth} if auth else {}
    kwargs = {"content": body, "headers": {**headers, "content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body, "headers": headers} if body is not None else {"headers": headers}
    r = httpx.request(method, server.url + path, timeout=30, **kwargs)
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
    err = r.json()["error"]
    assert err["message"] and err["type"]


def test_a_json_body_sent_as_a_form_says_which_header_to_add(server):
    """curl -d sends application/x-www-form-urlencoded; the error names the header rather than the body's type."""
    r = httpx.post(server.url + "/admin/routing/ramp", content=b'{"version": "v1"}', timeout=30,
                   headers={"authorization": f"Bearer {ADMIN_TOKEN}",
                            "content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "Invalid request: Expected a JSON body with Content-Type: application/json, got Content-Type: "
        "application/x-www-form-urlencoded (curl -d sends that: add -H 'Content-Type: application/json')")


def test_loading_a_version_from_elsewhere_names_the_flag_that_allows_it(server):
    r = httpx.post(server.url + "/admin/versions", json={"checkpoint": "/etc"}, timeout=30,
                   headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 400 and "got '/etc' (start the server with --checkpoint-dir DIR" in r.text


def test_table_is_large_enough():
    assert len(MALFORMED) >= 15


def test_admin_token_accepted_and_no_500_in_metrics(server):
    r = httpx.get(server.url + "/admin/routing", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200 and r.json()["shares"] == {"v1": 1.0}
    metrics = httpx.get(server.url + "/metrics").text
    assert 'status="500"' not in metrics


def test_admin_disabled_without_token(checkpoints):
    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], admin_token=None)
    cfg.admin_token = None  # even if POLYTURN_ADMIN_TOKEN is set where the tests run
    with RunningServer(create_app(cfg)) as srv:
        r = httpx.post(srv.url + "/admin/routing/rollback", headers={"authorization": "Bearer anything-anything"})
        assert r.status_code == 403 and "POLYTURN_ADMIN_TOKEN" in r.json()["error"]["message"]


def test_binds_loopback_by_default():
    from polyturn.cli import build_parser

    args = build_parser().parse_args(["serve", "--checkpoint", "x"])
    assert args.host == "127.0.0.1"
