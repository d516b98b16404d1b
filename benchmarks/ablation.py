"""Critic ablation: which critic helps RL improve on the same BC policy?

Runs RL from one BC checkpoint with four critics, for the same number of
environment episodes each, over several seeds, and prints held-out success
(mean and spread over seeds) and wall time:

* ``separate+priv`` — the asymmetric critic: its own model, reads privileged text;
* ``separate``      — the same critic without privileged text;
* ``shared``        — a value head on the actor's hidden states (symmetric baseline);
* ``none``          — no critic, group-relative (RLOO) baseline over 4 episodes per task.

Run by hand (it trains 4 x len(seeds) policies)::

    .venv/bin/python benchmarks/ablation.py --iters 30 --seeds 0 1 2

The BC phase runs once (or pass ``--bc-run DIR`` holding ``ckpt-bc`` and
``demos.jsonl`` from an earlier run); every variant then starts from that
actor (``actor.init_from``) with a fresh critic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.train.trainer import Trainer

VARIANTS = {
    "separate+priv": ["critic.kind=separate", "critic.privileged=true"],
    "separate": ["critic.kind=separate", "critic.privileged=false"],
    "shared": ["critic.kind=shared"],
    "none": ["critic.kind=none", "critic.group_size=4"],
}


def _spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/sql_tiny.yaml")
    p.add_argument("--out", default="runs/ablation")
    p.add_argument("--bc-run", default=None, help="run dir with ckpt-bc/ and demos.jsonl (skips the BC phase)")
    p.add_argument("--iters", type=int, default=30, help="RL iterations per variant (warm-up and mixed included)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-episodes", type=int, default=200)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = p.parse_args()
    _quiet_libraries()
    out = Path(args.out)
    warm, mixed = max(1, args.iters // 10), max(1, args.iters // 5)
    schedule = [f"curriculum.warmup_iters={warm}", f"curriculum.mixed_iters={mixed}",
                f"curriculum.ppo_iters={args.iters - warm - mixed}", f"env.eval_episodes={args.eval_episodes}",
                "run.checkpoint_every=1000"]

    bc_run = Path(args.bc_run) if args.bc_run else out / "bc"
    if not (bc_run / "ckpt-bc").is_dir():
        print(f"BC phase -> {bc_run}", flush=True)
        cfg = load_config(args.config, [f"run.out_dir={bc_run}", "curriculum.warmup_iters=0",
                                        "curriculum.mixed_iters=0", "curriculum.ppo_iters=0",
                                        f"env.eval_episodes={args.eval_episodes}"])
        Trainer(cfg).run()
    bc_eval = json.loads((bc_run / "summary.json").read_text())["eval"]

    rows = []
    for name in args.variants:
        res: dict[str, list[float]] = {"greedy": [], "sampled": [], "wall_min": []}
        for seed in args.seeds:
            run_dir = out / name / f"seed{seed}"
            overrides = [f"run.out_dir={run_dir}", f"run.seed={seed}", f"actor.init_from={bc_run / 'ckpt-bc'}",
                         f"bc.demos={bc_run / 'demos.jsonl'}", *schedule, *VARIANTS[name]]
            t0 = time.time()
            torch.manual_seed(seed)
            summary = Trainer(load_config(args.config, overrides)).run()
            res["wall_min"].append((time.time() - t0) / 60)
            res["greedy"].append(summary["eval"]["final"]["success_rate"])
            if "final_sampled" in summary["eval"]:
                res["sampled"].append(summary["eval"]["final_sampled"]["success_rate"])
            print(f"{name} seed {seed}: greedy {res['greedy'][-1]:.3f} "
                  f"sampled {res['sampled'][-1] if res['sampled'] else float('nan'):.3f} "
                  f"({res['wall_min'][-1]:.1f} min)", flush=True)
        rows.append((name, res))

    episodes = load_config(args.config).ppo.episodes_per_iter * args.iters
    print(f"\nCritic ablation: {args.iters} RL iterations ({episodes} training episodes) per run from one BC policy, "
          f"seeds {args.seeds}, {args.eval_episodes} held-out tasks")
    print(f"BC policy: greedy {bc_eval['bc']['success_rate']:.3f}"
          + (f", sampled {bc_eval['bc_sampled']['success_rate']:.3f}" if "bc_sampled" in bc_eval else ""))
    print("| critic | held-out success, greedy | held-out success, sampled (T=1) | wall time per run (min) |")
    print("|---|---|---|---|")
    for name, res in rows:
        sampled = _spread(res["sampled"]) if res["sampled"] else "-"
        print(f"| {name} | {_spread(res['greedy'])} | {sampled} | {statistics.mean(res['wall_min']):.1f} |")
    (out / "ablation.json").write_text(json.dumps({n: r for n, r in rows}, indent=2))


if __name__ == "__main__":
    main()
