"""Collection scale-out, side by side in one run: in-process, 1 and 2 Ray rollout workers, sync and async.

Each row builds the trainer of one config (BC skipped: the freshly built actor samples, which is all
throughput needs) and runs ``--iters`` RL iterations of the real loop (collect, critic, PPO update,
weight broadcast). It prints, per row:

* env turns/s: environment turns collected over the rows' wall time (updates included);
* learner idle: the share of that wall time the learner spent waiting for episodes
  (in-process: the whole collection);
* worker idle: the share of the workers' time between their collect calls;
* staleness: the mean / max policy-version lag of the turns trained on.

Run by hand (Ray on the local machine; ``--quick`` is the tiny test config, seconds per row)::

    python benchmarks/ray_scale.py --quick
    python benchmarks/ray_scale.py --config configs/sql_tiny.yaml --iters 4

The first iteration of each row (worker start-up, first batch) is not timed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polyturn  # noqa: F401  (registers the environments)
from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.acting.episodes import generate_demos
from polyturn.acting.jsonl import write_jsonl
from polyturn.train.trainer import Trainer

ROWS = [("in-process", 0, False), ("1 worker sync", 1, False), ("2 workers sync", 2, False),
        ("1 worker async", 1, True), ("2 workers async", 2, True)]
#: --quick (a smoke test, the figures mean nothing): in-process and one async worker, one timed iteration each
#: (the sync and the 2-worker async paths run in tests/train/test_rollout_workers.py; each worker is a process
#: that imports torch, which on a busy 2-core CI machine took most of this test's time).
QUICK_ROWS = [ROWS[0], ROWS[3]]


def run_row(config: str, overrides: list[str], *, workers: int, is_async: bool, iters: int) -> dict[str, float]:
    """Run ``iters`` timed RL iterations (after one untimed) with this collection mode; returns its figures."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(config, [*overrides, f"run.out_dir={out}", f"rollout.workers={workers}",
                                   f"rollout.async={str(is_async).lower()}", "curriculum.warmup_iters=0",
                                   "curriculum.mixed_iters=0", f"curriculum.ppo_iters={iters + 1}",
                                   "run.diagnose_every=0", "run.tensorboard=false"])
        tr = Trainer(cfg)
        tr.state.phase = "rl"
        tr.rl_iteration(0)
        tr.state.iter = 1
        t0 = time.perf_counter()
        rows = []
        for it in range(1, iters + 1):
            rows.append(tr.rl_iteration(it))
            tr.state.iter = it + 1
        wall = time.perf_counter() - t0
        if tr.remote is not None:
            tr.remote.close()
    turns = sum(r["charts/turns_mean"] * r["charts/episodes"] for r in rows)
    idle = sum(r.get("perf/learner_idle_s", r["perf/gen_s"]) for r in rows)
    return {"turns_per_s": turns / wall, "learner_idle": idle / wall,
            "worker_idle": sum(r.get("perf/worker_idle_share", 0.0) for r in rows) / len(rows),
            "staleness_mean": sum(r.get("async/staleness_mean", 0.0) for r in rows) / len(rows),
            "staleness_max": max(r.get("async/staleness_max", 0.0) for r in rows), "wall_s": wall}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/sql_tiny.yaml")
    p.add_argument("--quick", action="store_true",
                   help="configs/test_tiny.yaml, 1 timed iteration, rows in-process and 1 worker async")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", default=None, help="also write the table here")
    args = p.parse_args(argv)
    _quiet_libraries()
    import ray

    config, iters = ("configs/test_tiny.yaml", 1) if args.quick else (args.config, args.iters)
    demos = Path(tempfile.mkdtemp()) / "demos.jsonl"
    write_jsonl(demos, generate_demos("polyturn/SQLAnalyst-v0", episodes=16, noise=0.3, seed=0))
    overrides = [f"bc.demos={demos}", *args.set]
    own_ray = not ray.is_initialized()  # a test runs --quick in its own local Ray instance
    if own_ray:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    results = {}
    print(f"{'collection':<18} {'env turns/s':>11} {'learner idle':>12} {'worker idle':>11} {'staleness':>11}")
    for name, workers, is_async in (QUICK_ROWS if args.quick else ROWS):
        r = run_row(config, overrides, workers=workers, is_async=is_async, iters=iters)
        results[name] = r
        stale = f"{r['staleness_mean']:.2f}/{r['staleness_max']:.0f}"
        print(f"{name:<18} {r['turns_per_s']:>11.1f} {r['learner_idle']:>12.0%} "
              f"{(r['worker_idle'] if workers else float('nan')):>11.0%} {stale:>11}", flush=True)
    if own_ray:
        ray.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
