"""BC minibatches of SmolLM2 on CustomerService, as `configs/customer_service_smollm2.yaml` trains them, with and
without `actor.shared_prefix` (the system prompt every demonstration opens with run once per micro-batch), side by
side in one process: the arms take turns, each minibatch's forward + backward timed, medians printed.

    taskset -c 1 .venv/bin/python benchmarks/shared_prefix.py --threads 1 --repeats 3

(about 20 minutes on one AVX2 core in fp32; the 4096 arm needs ~12 GB free: the kernel killed it once at 11.9
GB, 2026-12-07, docs/smollm2.md). The demonstrations are the config's (the exact expert with
explained thoughts), tokenized as BC reads them. ``--quick``: the tiny preset on the same env, 8 demonstrations,
one repeat: that it runs (its figures mean nothing).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.train.batch import MicroStats, common_prefix
from polyturn.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
#: (name, actor.shared_prefix, actor.microbatch_tokens)
#: (A whole minibatch of 8 in one pass, ~12.6k tokens, needed over 13 GB: the kernel killed it, 2026-12-07.)
ARMS = [("one pass a demonstration (shipped: budget 1024)", False, 1024),
        ("shared prefix, budget 2048", True, 2048),
        ("shared prefix, budget 4096", True, 4096)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="minibatches per arm")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    _quiet_libraries()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            cfg = load_config(ROOT / "configs" / "test_tiny.yaml", [
                f"run.out_dir={tmp}/run", "env.id=polyturn/CustomerService-v0", "rollout.system_prompt=true",
                "bc.episodes=8", "bc.batch_episodes=4", "rollout.context_budget=2048"])
            args.repeats = 1
        else:
            cfg = load_config(ROOT / "configs" / "customer_service_smollm2.yaml", [
                f"run.out_dir={tmp}/run", f"run.precision={args.precision}", "bc.episodes=32",
                f"run.train_threads={args.threads}", f"run.rollout_threads={args.threads}"])
        tr = Trainer(cfg)
        policy, size = tr.policy, cfg.bc.batch_episodes
        demos = policy.demos
        lengths = [sum(len(s) for s in segs) for segs in demos]
        shared = common_prefix([s.ids for segs in demos for s in segs])
        print(f"{cfg.actor.preset}, {args.precision}, {args.threads} thread(s): {len(demos)} demonstrations of "
              f"{statistics.mean(lengths):.0f} tokens on average (at most {max(lengths)}), {shared} of them the "
              f"prefix all share; minibatches of {size}", flush=True)
        policy.actor.model.train()
        for loss in policy.bc_loss(list(range(size)), MicroStats()):  # warm-up, not timed
            loss.backward()
        times: dict[str, list[float]] = {name: [] for name, _, _ in ARMS}
        losses: dict[int, list[float]] = {}  # each minibatch's BC loss in every arm: the same function
        for rep in range(args.repeats):
            idx = [i % len(demos) for i in range(rep * size, rep * size + size)]
            for name, on, budget in ARMS:
                policy.cfg = cfg.model_copy(update={"actor": cfg.actor.model_copy(
                    update={"shared_prefix": on, "microbatch_tokens": budget})})
                policy.opt.zero_grad()
                t0 = time.perf_counter()
                total = 0.0
                for loss in policy.bc_loss(idx, MicroStats()):
                    loss.backward()
                    total += loss.item()
                times[name].append(time.perf_counter() - t0)
                losses.setdefault(rep, []).append(total)
                print(f"  minibatch {rep}: {name}: {times[name][-1]:.2f} s", flush=True)
        gap = max(abs(x - v[0]) / abs(v[0]) for v in losses.values() for x in v)
        print(f"the same BC loss in every arm: largest relative difference {gap:.1e}"
              + ("" if gap < 1e-4 else " (NOT THE SAME: exit status 1)"))
        base = statistics.median(times[ARMS[0][0]])
        print("\n| BC minibatch, forward + backward | median s | vs shipped |\n|---|---|---|")
        for name, _, _ in ARMS:
            m = statistics.median(times[name])
            print(f"| {name} | {m:.2f} | {base / m:.2f}x |")
    return 0 if gap < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
