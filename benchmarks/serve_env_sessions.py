"""Serve an agent and drive N concurrent environment-backed sessions through it, each to the episode's end.

Starts the real server (``polyturn serve`` in a subprocess, on a loopback port) on a checkpoint and opens
``--sessions`` environment sessions at once (default 32, ``polyturn/CustomerService-v0``): the server holds
each session's environment, so the environment's own simulated customer answers the agent. Each session runs
one agent turn per request (``POST /v1/sessions/{id}/turns``) until its episode ends, then starts the next task,
until ``--episodes`` episodes are done in all. Held-out task seeds (1,000,000 on) by default. Prints:

* completion rate (episodes the environment judged successful),
* error responses per episode (turns whose step reported an error: the environments' ``error_responses``),
* turns per episode, and P50/P95/P99 of the turn latency a client sees (request to response, queueing in
  the batched engine included), plus the server's mean decode rows per step.

    .venv/bin/python benchmarks/serve_env_sessions.py --checkpoint runs/cs_smollm2_s0/ckpt-final
    .venv/bin/python benchmarks/serve_env_sessions.py --quick          # a tiny untrained checkpoint, 4 sessions

``--engine both`` serves the checkpoint twice on the same tasks, generation by the home engine and by vLLM
(``polyturn serve --engine vllm``; ``make vllm-venv`` first), and prints vLLM's latencies as ratios to the home
engine's, from the same run. ``--lora both`` serves a LoRA checkpoint twice on the same tasks, adapters unmerged
(the server's default) and merged into the base weights (``--merge-lora``), and prints the decode-step ratio.
``--record DIR`` passes
``--record`` to the server (``DIR/unmerged`` and ``DIR/merged`` with ``--lora both``): the finished sessions
land in ``DIR/sessions.jsonl`` as episode records that ``polyturn train --set bc.demos=DIR/sessions.jsonl``
reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import pct, server_stats, start_server, tiny_checkpoint  # noqa: E402  (the sibling benchmark)

HELD_OUT_SEED = 1_000_000


async def one_session(c: httpx.AsyncClient, *, env_id: str, seeds: asyncio.Queue, max_turns: int,
                      out: dict) -> None:
    """Open a session, then play tasks from ``seeds`` to their end until the queue is empty; close it."""
    sid = None
    while not seeds.empty():
        seed = seeds.get_nowait()
        if sid is None:
            r = await c.post("/v1/sessions", json={"env": env_id, "seed": seed})
        else:
            r = await c.post(f"/v1/sessions/{sid}/reset", json={"seed": seed})
        r.raise_for_status()
        sid = r.json()["id"]
        errors = turns = 0
        for _ in range(max_turns):
            t0 = time.perf_counter()
            r = await c.post(f"/v1/sessions/{sid}/turns", json={"max_steps": 1})
            out["latency"].append(time.perf_counter() - t0)
            r.raise_for_status()
            data = r.json()
            turns += len(data["turns"])
            errors += sum(t["error"] is not None for t in data["turns"])
            if data["session"]["done"]:
                break
        session = data["session"]
        out["episodes"].append({"seed": seed, "task_id": session["task_id"], "success": bool(session["success"]),
                                "done": bool(session["done"]), "turns": turns, "error_responses": errors})
    if sid is not None:
        await c.delete(f"/v1/sessions/{sid}")


async def drive(url: str, *, env_id: str, sessions: int, episodes: int, seed0: int, max_turns: int) -> dict:
    """``episodes`` tasks over ``sessions`` concurrent sessions; per-turn latencies and per-episode outcomes."""
    out: dict = {"latency": [], "episodes": []}
    seeds: asyncio.Queue = asyncio.Queue()
    for k in range(episodes):
        seeds.put_nowait(seed0 + k)
    limits = httpx.Limits(max_connections=sessions + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(one_session(c, env_id=env_id, seeds=seeds, max_turns=max_turns, out=out)
                               for _ in range(sessions)))
        out["wall_s"] = time.perf_counter() - t0
        out["server"] = server_stats((await c.get("/metrics")).text)
    return out


def summarize(out: dict) -> dict[str, float]:
    """The figures the module docstring lists, from :func:`drive`'s result."""
    eps, lat = out["episodes"], out["latency"]
    return {"episodes": len(eps), "completion": statistics.fmean(e["success"] for e in eps),
            "error_responses": statistics.fmean(e["error_responses"] for e in eps),
            "turns": statistics.fmean(e["turns"] for e in eps), "unfinished": sum(not e["done"] for e in eps),
            "p50_s": pct(lat, 50), "p95_s": pct(lat, 95), "p99_s": pct(lat, 99), "max_s": max(lat),
            "turns_per_s": len(lat) / out["wall_s"], "wall_s": out["wall_s"], **out["server"]}


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None, help="checkpoint directory (default: a tiny untrained one)")
    p.add_argument("--env", default="polyturn/CustomerService-v0")
    p.add_argument("--sessions", type=int, default=32, help="concurrent sessions")
    p.add_argument("--episodes", type=int, default=None, help="episodes in all (default: one per session)")
    p.add_argument("--seed", type=int, default=HELD_OUT_SEED, help="first task seed (default: held-out seeds)")
    p.add_argument("--max-turns", type=int, default=20, help="turn requests per episode at most")
    p.add_argument("--record", default=None, metavar="DIR", help="the server records sessions to DIR/sessions.jsonl")
    p.add_argument("--threads", type=int, default=None, help="server torch threads")
    p.add_argument("--device", default=None, help="the server's --device (default: its own, auto)")
    p.add_argument("--precision", default=None, help="the server's --precision (default: its own, fp32)")
    p.add_argument("--lora", choices=("unmerged", "merged", "both"), default="unmerged",
                   help="serve a LoRA checkpoint with its adapters unmerged (the server's default), merged "
                        "(--merge-lora), or both, one after the other on the same tasks, with the step-time ratio")
    p.add_argument("--engine", choices=("home", "vllm", "both"), default="home",
                   help="the server's generation engine; both: home, then vLLM, on the same tasks")
    p.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="with --engine vllm: vLLM's interpreter")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures and episodes as JSON")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny checkpoint, 4 sessions, 4 episodes")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.episodes, args.max_turns = 4, args.episodes or 4, 6
    episodes = args.episodes or args.sessions
    if args.engine == "both" and args.lora == "both":
        p.error("--engine both and --lora both each serve the checkpoint twice: give one of them")
    engines = ("home", "vllm") if args.engine == "both" else (args.engine,)
    # Each server run: (its row's name, engine, LoRA merged).
    if args.lora == "both":
        runs = [("unmerged", engines[0], False), ("merged", engines[0], True)]
    else:
        runs = [(e if len(engines) > 1 else args.lora, e, args.lora == "merged") for e in engines]
    results: dict[str, tuple[dict, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(args.checkpoint) if args.checkpoint else tiny_checkpoint(Path(tmp), args.env)
        for mode, engine, merged in runs:
            record = Path(args.record) / mode if args.record and len(runs) > 1 else args.record
            extra = ["--record", str(record)] if record is not None else []
            for flag in ("device", "precision"):
                if getattr(args, flag):
                    extra += [f"--{flag}", getattr(args, flag)]
            extra += ["--merge-lora"] if merged else []
            if engine == "vllm":
                extra += ["--engine", "vllm", "--vllm-python", args.vllm_python]
            proc, url = start_server(ckpt, sessions=args.sessions, threads=args.threads, extra=extra,
                                     timeout_s=900 if engine == "vllm" else 120)
            try:
                out = asyncio.run(drive(url, env_id=args.env, sessions=args.sessions, episodes=episodes,
                                        seed0=args.seed, max_turns=args.max_turns))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            results[mode] = summarize(out), out
    print(f"{args.env}, {args.sessions} concurrent sessions, checkpoint {ckpt if args.checkpoint else 'tiny (untrained)'}")
    first = f"engine (LoRA {args.lora})" if len(engines) > 1 else "LoRA"
    print(f"| {first} | episodes | completion | error responses / episode | turns / episode | unfinished | "
          "turn latency P50 / P95 / P99 (s) | turns/s | decode rows / step | decode step (ms) | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, (fig, _) in results.items():
        print(f"| {mode} | {fig['episodes']} | {fig['completion']:.3f} | {fig['error_responses']:.2f} | "
              f"{fig['turns']:.2f} | {fig['unfinished']} | {fig['p50_s']:.3f} / {fig['p95_s']:.3f} / "
              f"{fig['p99_s']:.3f} | {fig['turns_per_s']:.2f} | {fig['rows_per_step']:.1f} | {fig['step_ms']:.1f} | "
              f"{fig['wall_s']:.1f} |")
    for mode, (fig, _) in results.items():
        if not fig["decode_steps"]:  # vLLM's steps are its own: the server counts none
            continue
        decode_s = fig["completion_tokens_per_turn"] * fig["step_ms"] / 1000
        print(f"Where a turn's time goes ({mode}, server /metrics): {fig['decode_steps']:.0f} decode steps of "
              f"{fig['step_ms']:.1f} ms mean ({fig['rows_per_step']:.1f} rows); a turn samples "
              f"{fig['completion_tokens_per_turn']:.1f} tokens (~{decode_s:.3f} s of decode steps) after "
              f"{fig['queue_s']:.3f} s mean waiting for its first step, and prefills "
              f"{fig['prompt_tokens_per_turn']:.0f} prompt tokens.")
    if "vllm" in results and "home" in results:
        home, vllm = results["home"][0], results["vllm"][0]
        print(f"vllm / home, same run: p50 {vllm['p50_s'] / home['p50_s']:.2f}x, "
              f"p99 {vllm['p99_s'] / home['p99_s']:.2f}x, turns/s {vllm['turns_per_s'] / home['turns_per_s']:.2f}x")
    elif len(results) == 2:
        print(f"merged / unmerged decode step: {results['merged'][0]['step_ms'] / results['unmerged'][0]['step_ms']:.2f}x")
    fig, out = results[runs[0][0]]
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": {m: f for m, (f, _) in results.items()} if len(results) > 1
                                               else fig, "episodes": out["episodes"]}, indent=1))
    return fig


if __name__ == "__main__":
    main()
