"""Off-policy estimates against online evaluation: how far off they are, and whether their intervals cover.

Serves ``--incumbent`` (``polyturn serve --record`` in a subprocess, on a loopback port) for ``--sessions``
environment sessions sampled at temperature 1 (held-out task seeds), each played to its end. Then, for each
``--candidate`` (the incumbent included, as a check: its weights are 1), estimates its success and return on the
recorded sessions (:func:`polyturn.acting.ope.estimate`: per-decision WIS, and doubly robust with the candidate's
critic) and measures them online: the candidate played at temperature 1 on the same task seeds
(:func:`polyturn.acting.checkpoint.run_actor`, ``--online`` episodes). Prints a Markdown table: online value with
its normal 95% interval, each estimate with its bootstrap interval and whether that covers the online value,
the effective sample size.

    .venv/bin/python benchmarks/ope_online.py --incumbent runs/demo/<stamp>/ckpt-bc \\
        --candidate runs/demo/<stamp>/ckpt-iter0020 runs/demo/<stamp>/ckpt-iter0060 runs/demo/<stamp>/ckpt-final
    .venv/bin/python benchmarks/ope_online.py --quick     # a tiny untrained checkpoint, 4 sessions: that it runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import start_server, tiny_checkpoint  # noqa: E402  (the sibling benchmark)

from polyturn.acting.checkpoint import load_checkpoint, run_actor  # noqa: E402
from polyturn.acting.ope import estimate, load_value_critic, read_records  # noqa: E402

HELD_OUT_SEED = 1_000_000


async def record(url: str, *, env_id: str, seeds: list[int], concurrency: int) -> None:
    """Play each seed's task to its end in its own session (temperature 1), ``concurrency`` at once; close each."""
    queue: asyncio.Queue = asyncio.Queue()
    for s in seeds:
        queue.put_nowait(s)

    async def worker(c: httpx.AsyncClient) -> None:
        while not queue.empty():
            seed = queue.get_nowait()
            r = await c.post("/v1/sessions", json={"env": env_id, "seed": seed, "temperature": 1.0})
            r.raise_for_status()
            sid = r.json()["id"]
            (await c.post(f"/v1/sessions/{sid}/turns", json={"max_steps": 64})).raise_for_status()
            await c.delete(f"/v1/sessions/{sid}")

    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as c:
        await asyncio.gather(*(worker(c) for _ in range(concurrency)))


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its normal 95% interval."""
    m = statistics.fmean(xs)
    return m, 1.96 * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--incumbent", default=None, help="the served checkpoint (default: a tiny untrained one)")
    p.add_argument("--candidate", nargs="*", default=[], help="checkpoints to estimate (the incumbent is added)")
    p.add_argument("--env", default="polyturn/SQLAnalyst-v0")
    p.add_argument("--sessions", type=int, default=200, help="recorded sessions of the incumbent")
    p.add_argument("--online", type=int, default=400, help="online episodes per candidate (the same seeds, cycled)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--clip", type=float, default=10.0)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny untrained checkpoint, 4 sessions")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.online, args.concurrency = 4, 4, 4
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        incumbent = Path(args.incumbent) if args.incumbent else tiny_checkpoint(Path(tmp), args.env)
        seeds = [HELD_OUT_SEED + k for k in range(args.sessions)]
        proc, url = start_server(incumbent, sessions=args.concurrency, threads=1,
                                 extra=["--record", str(Path(tmp) / "rec")])
        try:
            asyncio.run(record(url, env_id=args.env, seeds=seeds, concurrency=args.concurrency))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        records = read_records([Path(tmp) / "rec"])
        tasks = [{"seed": seeds[k % len(seeds)], "options": {}} for k in range(args.online)]
        for path in [str(incumbent), *args.candidate]:
            ckpt = load_checkpoint(path)
            critic, why = load_value_critic(ckpt.actor_dir.parent)
            rep = estimate(ckpt.actor, records, policy=ckpt.label, critic=critic, dr_unavailable=why, clip=args.clip,
                           n_resamples=1000)
            eps = run_actor(ckpt, tasks, temperature=1.0, seed=1, env_id=args.env)
            online = {"success": mean_ci([float(e.success) for e in eps]),
                      "return": mean_ci([e.episode_return for e in eps])}
            row = {"checkpoint": path, "ess": rep.ess, "clipped": rep.clipped, "online": online,
                   "recorded": rep.recorded, "estimates": {}}
            for name, est in [*(("wis " + k, v) for k, v in rep.wis.items()),
                              *(("dr " + k, v) for k, v in (rep.dr or {}).items())]:
                truth = online[name.split()[1]][0]
                row["estimates"][name] = {"value": est.value, "lo": est.lo, "hi": est.hi,
                                          "error": est.value - truth, "covers": est.lo <= truth <= est.hi}
            rows.append(row)
    print(f"{args.env}: {len(records)} recorded sessions of {incumbent if args.incumbent else 'tiny (untrained)'} "
          f"(temperature 1; success {rows[0]['recorded']['success']:.3f}, return {rows[0]['recorded']['return']:.2f})")
    print("| checkpoint | online success | WIS success [95%] | covers | online return | WIS return [95%] | covers "
          "| DR return [95%] | covers | ESS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [Path(r["checkpoint"]).name]
        for metric in ("success", "return"):
            m, h = r["online"][metric]
            cells.append(f"{m:.3f} ± {h:.3f}")
            for est in (f"wis {metric}", f"dr {metric}") if metric == "return" else (f"wis {metric}",):
                e = r["estimates"].get(est)
                cells += [f"{e['value']:.3f} [{e['lo']:.3f}, {e['hi']:.3f}]", "yes" if e["covers"] else "no"] \
                    if e else ["n/a", ""]
        cells.append(f"{r['ess']:.1f}")
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
