"""RL iterations with the critic's update beside the next sampling (``run.critic_beside``) and in line, side by side.

Two trainers start from the same checkpoint in one process and take turns: blocks of ``--block`` RL iterations,
the order alternating from round to round, each block ending with the last update joined (as a checkpoint or an
evaluation does), so the machine's drift falls on both alike. Beside: the critic's update runs in a thread of its
own during the next iteration's sampling, each with ``run.rollout_threads``; in line: before the actor's update,
with ``run.train_threads``. The two runs' paths part after the first update (another thread count sums in another
order), so their workloads are alike, not equal. Prints each side's wall time and where it went, and the ratio.

Run by hand, on a demo run's checkpoint (64 episodes an iteration, the demo's threads: 1 sampling, 2 training)::

    .venv/bin/python benchmarks/critic_beside.py --checkpoint runs/demo/<ts>/ckpt-iter0040
    .venv/bin/python benchmarks/critic_beside.py --quick   # benchmarks/quick.py's tiny run: that it runs
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.runtime import long_lived_frozen
from polyturn.train.trainer import Trainer

PARTS = ("perf/gen_s", "perf/values_s", "perf/update_critic_s", "perf/update_actor_s", "perf/critic_wait_s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a run's ckpt-* directory (its demos.jsonl is one level up)")
    p.add_argument("--config", default="configs/sql_tiny.yaml")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--block", type=int, default=5, help="RL iterations per side per round")
    p.add_argument("--quick", action="store_true", help="one round of 2 iterations on the tiny run's BC checkpoint")
    args = p.parse_args()
    overrides = []
    if args.quick:
        from quick import TINY_CONFIG, tiny_run

        args.checkpoint = args.checkpoint or str(tiny_run() / "ckpt-bc")
        args.config, args.rounds, args.block = str(TINY_CONFIG), 1, 2
        overrides = ["run.train_threads=2", "run.rollout_threads=1"]  # the tiny config trains on one thread
    if not args.checkpoint:
        p.error("Expected --checkpoint DIR (or --quick)")
    _quiet_libraries()
    ckpt = Path(args.checkpoint)
    trainers = {}
    for side, on in (("beside", True), ("in line", False)):
        cfg = load_config(args.config, [f"actor.init_from={ckpt}", f"bc.demos={ckpt.parent / 'demos.jsonl'}",
                                        f"run.out_dir={tempfile.mkdtemp(prefix='polyturn-bench-beside-')}",
                                        "run.tensorboard=false", "run.eval_start=false", "run.diagnose_every=0",
                                        f"run.critic_beside={on}", *overrides])
        trainers[side] = Trainer(cfg)
    assert trainers["beside"].critic_update.beside and not trainers["in line"].critic_update.beside
    with long_lived_frozen():  # as the trainer's run does
        wall = dict.fromkeys(trainers, 0.0)
        parts = {side: dict.fromkeys(PARTS, 0.0) for side in trainers}
        it = dict.fromkeys(trainers, 0)
        for rnd in range(args.rounds):
            for side in (list(trainers) if rnd % 2 == 0 else list(trainers)[::-1]):
                tr = trainers[side]
                t = time.perf_counter()
                rows = []
                for _ in range(args.block):
                    rows.append(tr.rl_iteration(it[side]))
                    it[side] += 1
                tr.critic_update.finish()
                wall[side] += time.perf_counter() - t
                for r in rows:  # complete now: the last update has been joined
                    for k in PARTS:
                        parts[side][k] += r.get(k, 0.0)
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(f"{s} {w:.1f} s" for s, w in wall.items()), flush=True)
    for tr in trainers.values():
        tr.critic_update.close()
    n = args.rounds * args.block
    print(f"\n{ckpt}: {n} RL iterations a side, {args.rounds} alternating rounds of {args.block}")
    print("| critic update | wall s | s / iteration | gen | values | critic update | actor update | critic wait |")
    print("|---|---|---|---|---|---|---|---|")
    for side in trainers:
        print(f"| {side} | {wall[side]:.1f} | {wall[side] / n:.2f} | "
              + " | ".join(f"{parts[side][k]:.1f}" for k in PARTS) + " |")
    print(f"beside / in line, wall time: {wall['beside'] / wall['in line']:.3f}")


if __name__ == "__main__":
    main()
