"""Load test of ``polyturn serve``: N concurrent sessions, fixed turns, batched vs one request at a time.

Starts the real server (``polyturn serve`` in a subprocess, on a loopback
port) three times on the same checkpoint — batching every live session's turn
(the default, a long observation prefilled in chunks of 64 tokens beside the
decoding rows), the same with ``--prefill-chunk 0`` (each turn's context in one
pass), and with ``--unbatched`` (one request at a time, each session with its
own single-row KV cache: the baseline keeps the incremental cache and loses
only the batching) — and drives it with N concurrent sessions
(default 32) for a fixed number of agent turns each. Environment sessions (default) run the SQL analyst's tools
on the server, so a turn's latency is decode + tool. Prints throughput,
errors and latency p50/p95/p99 per mode as a Markdown table.

    .venv/bin/python benchmarks/serve_load.py --checkpoint runs/demo/<stamp>/ckpt-final
    .venv/bin/python benchmarks/serve_load.py            # a tiny untrained checkpoint, built here
    .venv/bin/python benchmarks/serve_load.py --quick    # 2 sessions x 1 turn on it, batched only: that it runs
    .venv/bin/python benchmarks/serve_load.py --engines  # --engine home against --engine vllm (docs/vllm.md)

With ``--engines`` the modes are the two engines instead, and the vLLM row's latencies and throughput are also
printed as ratios to the home engine's, from the same run.

An episode that ends before its turns are done is reset (same session, next
seed) and continues; resets are not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def tiny_checkpoint(root: Path, env_id: str = "polyturn/SQLAnalyst-v0") -> Path:
    """An untrained tiny actor (the demo's architecture) for ``env_id``, its tokenizer trained on the env's tool
    docs, with a default config."""
    from polyturn.acting.registry import make_env
    from polyturn.config import load_config, save_config
    from polyturn.models.actor import tiny_actor
    from polyturn.models.chat import SIMPLE_SPECIAL_TOKENS
    from polyturn.models.tokenizer import train_tokenizer

    env = make_env(env_id)
    corpus = [env.unwrapped.tool_docs()] * 20
    env.close()
    tok = train_tokenizer(corpus, vocab_size=512, special_tokens=SIMPLE_SPECIAL_TOKENS)
    actor = tiny_actor(tok, hidden=128, layers=2, heads=4)
    ckpt = root / "tiny"
    actor.save_pretrained(ckpt / "actor")
    save_config(load_config(None, [f"env.id={env_id}", "rollout.max_action_tokens=32",
                                   "rollout.context_budget=512"]), ckpt / "config.yaml")
    return ckpt


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(ckpt: Path, *, sessions: int, threads: int | None = None, extra: Sequence[str] = (),
                 timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """``polyturn serve`` in a subprocess on a free loopback port (``extra``: more flags); it and its URL once
    ``/health`` answers (within ``timeout_s``: a vLLM server's start takes most of a minute on a busy CPU)."""
    port = free_port()
    cmd = [sys.executable, "-m", "polyturn.cli", "serve", "--checkpoint", str(ckpt), "--port", str(port),
           "--max-sessions", str(sessions + 2), "--session-timeout", "900", *extra]
    if threads:
        cmd += ["--threads", str(threads)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start in {timeout_s:.0f} s")


async def one_session(c: httpx.AsyncClient, i: int, *, turns: int, kind: str, out: dict) -> None:
    body = {"env": "polyturn/SQLAnalyst-v0", "seed": 1_000_000 + i} if kind == "env" else {}
    r = await c.post("/v1/sessions", json=body)
    if r.status_code != 200:
        out["errors"] += turns
        return
    sid, seed = r.json()["id"], 1_000_000 + i
    for t in range(turns):
        payload = {"max_steps": 1} if kind == "env" else {"message": f"Which product sold most in week {t}?"}
        t0 = time.perf_counter()
        r = await c.post(f"/v1/sessions/{sid}/turns", json=payload)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            out["errors"] += 1
            continue
        data = r.json()
        out["latency"].append(dt)
        out["tokens"] += sum(x["n_tokens"] for x in data["turns"])
        if data["session"]["done"]:
            seed += 1000
            await c.post(f"/v1/sessions/{sid}/reset", json={"seed": seed})
    await c.delete(f"/v1/sessions/{sid}")


async def drive(url: str, *, sessions: int, turns: int, kind: str) -> dict:
    out = {"latency": [], "errors": 0, "tokens": 0}
    limits = httpx.Limits(max_connections=sessions + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as c:
        await one_session(c, 10**5, turns=1, kind=kind, out={"latency": [], "errors": 0, "tokens": 0})  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(one_session(c, i, turns=turns, kind=kind, out=out) for i in range(sessions)))
        out["wall_s"] = time.perf_counter() - t0
        out["server"] = server_stats((await c.get("/metrics")).text)
    return out


def server_stats(metrics: str) -> dict[str, float]:
    """Where a served turn's time goes, from the server's /metrics (all arms together): decode steps, their mean
    rows and milliseconds, the mean wait before a turn's first decode step, and the tokens prefilled (prompt)
    and sampled (completion) per turn."""
    from prometheus_client.parser import text_string_to_metric_families

    total: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            key = s.name + (":" + s.labels["kind"] if "kind" in s.labels else "")
            total[key] = total.get(key, 0.0) + s.value

    def per(num: str, den: str) -> float:
        return total.get(num, 0.0) / total[den] if total.get(den) else float("nan")

    turns = "polyturn_queue_seconds_count"  # one observation per served turn
    return {"decode_steps": total.get("polyturn_decode_step_seconds_count", 0.0),
            "rows_per_step": per("polyturn_decode_batch_rows_sum", "polyturn_decode_batch_rows_count"),
            "step_ms": 1000 * per("polyturn_decode_step_seconds_sum", "polyturn_decode_step_seconds_count"),
            "queue_s": per("polyturn_queue_seconds_sum", turns),
            "prompt_tokens_per_turn": per("polyturn_tokens_total:prompt", turns),
            "completion_tokens_per_turn": per("polyturn_tokens_total:completion", turns)}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None, help="checkpoint directory (default: a tiny untrained one)")
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=4, help="agent turns per session")
    p.add_argument("--kind", choices=["env", "chat"], default="env")
    p.add_argument("--threads", type=int, default=None, help="server torch threads")
    p.add_argument("--quick", action="store_true",
                   help="2 sessions x 1 turn, batched only (the other modes have tests of their own): that it runs")
    p.add_argument("--engines", action="store_true",
                   help="compare --engine home and --engine vllm (batched both) instead of the batching modes")
    p.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="with --engines: vLLM's interpreter")
    args = p.parse_args()
    if args.quick:
        args.sessions, args.turns = 2, 1
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(args.checkpoint) if args.checkpoint else tiny_checkpoint(Path(tmp))
        rows = []
        modes = [("batched", []), ("batched, prefill unchunked", ["--prefill-chunk", "0"]),
                 ("one at a time", ["--unbatched"])]
        if args.engines:
            modes = [("home", ["--engine", "home"]),
                     ("vllm", ["--engine", "vllm", "--vllm-python", args.vllm_python])]
        for mode, flags in modes[:1] if args.quick else modes:
            proc, url = start_server(ckpt, sessions=args.sessions, threads=args.threads, extra=flags,
                                     timeout_s=900 if "vllm" in flags else 120)
            try:
                res = asyncio.run(drive(url, sessions=args.sessions, turns=args.turns, kind=args.kind))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            lat = res["latency"]
            rows.append((mode, len(lat), res["errors"], len(lat) / res["wall_s"], res["tokens"] / res["wall_s"],
                         1000 * statistics.median(lat) if lat else float("nan"), 1000 * pct(lat, 95),
                         1000 * pct(lat, 99), res["server"]["rows_per_step"], res["server"]["step_ms"]))
    print(f"\n{args.sessions} concurrent {args.kind} sessions x {args.turns} turns, checkpoint "
          f"{args.checkpoint or 'tiny (untrained, built here)'}\n")
    print("| serving | turns | errors | turns/s | tokens/s | p50 ms | p95 ms | p99 ms | rows/step | ms/step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {r[4]:.0f} | {r[5]:.0f} | {r[6]:.0f} | {r[7]:.0f} "
              f"| {r[8]:.1f} | {r[9]:.1f} |")
    if args.engines and len(rows) == 2:
        home, vllm = rows
        print(f"\nvllm / home, same run: p50 {vllm[5] / home[5]:.2f}x, p99 {vllm[7] / home[7]:.2f}x, "
              f"turns/s {vllm[3] / home[3]:.2f}x, tokens/s {vllm[4] / home[4]:.2f}x")


if __name__ == "__main__":
    main()
