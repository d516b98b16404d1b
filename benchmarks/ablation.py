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

``--quick`` runs the two ends (``separate+priv`` and ``none``) for 2 iterations from the tiny run of
``benchmarks/quick.py`` (``configs/test_tiny.yaml``), one seed, 4 held-out tasks, into a temporary directory:
that it runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
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
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run (repeatable), e.g. run.train_threads=1")
    p.add_argument("--quick", action="store_true",
                   help="separate+priv and none for 2 iterations from benchmarks/quick.py's tiny run, 1 seed, 4 tasks")
    args = p.parse_args()
    if args.quick:
        from quick import TINY_CONFIG, tiny_run

        args.config, args.bc_run, args.iters, args.seeds, args.eval_episodes = str(TINY_CONFIG), str(tiny_run()), 2, [0], 4
        args.variants = ["separate+priv", "none"]
        args.out = tempfile.mkdtemp(prefix="polyturn-ablation-quick-")
    _quiet_libraries()
    out = Path(args.out)
    warm, mixed = max(1, args.iters // 10), max(1, args.iters // 5)
    schedule = [f"curriculum.warmup_iters={warm}", f"curriculum.mixed_iters={mixed}",
                f"curriculum.ppo_iters={args.iters - warm - mixed}", f"env.eval_episodes={args.eval_episodes}",
                "run.checkpoint_every=1000", *args.overrides]

    bc_run = Path(args.bc_run) if args.bc_run else out / "bc"
    if not (bc_run / "ckpt-bc").is_dir():
        print(f"BC phase -> {bc_run}", flush=True)
        cfg = load_config(args.config, [f"run.out_dir={bc_run}", "curriculum.warmup_iters=0",
                                        "curriculum.mixed_iters=0", "curriculum.ppo_iters=0",
                                        f"env.eval_episodes={args.eval_episodes}"])
        Trainer(cfg).run()

    for name in args.variants:
        for seed in args.seeds:
            run_dir = out / name / f"seed{seed}"
            if (run_dir / "summary.json").is_file():
                continue  # finished earlier: runs accumulate, so variants can be run (or resumed) separately
            overrides = [f"run.out_dir={run_dir}", f"run.seed={seed}", f"actor.init_from={bc_run / 'ckpt-bc'}",
                         f"bc.demos={bc_run / 'demos.jsonl'}", *schedule, *VARIANTS[name]]
            torch.manual_seed(seed)
            ev = Trainer(load_config(args.config, overrides)).run()["eval"]
            print(f"{name} seed {seed}: greedy {ev['final']['success_rate']:.3f}, "
                  f"sampled {ev.get('final_sampled', {}).get('success_rate', float('nan')):.3f}", flush=True)
    print_table(out, iters=args.iters, seeds=args.seeds, eval_episodes=args.eval_episodes,
                episodes_per_iter=load_config(args.config).ppo.episodes_per_iter)


def print_table(out: Path, *, iters: int, seeds: list[int], eval_episodes: int, episodes_per_iter: int) -> None:
    """The ablation table from every finished run's summary.json under ``out``."""
    print(f"\nCritic ablation: {iters} RL iterations ({iters * episodes_per_iter} training episodes) per run "
          f"from one BC policy, seeds {seeds}, {eval_episodes} held-out tasks; mean ± stdev over seeds")
    print("| critic | BC start, greedy | final, greedy | BC start, sampled (T=1) | final, sampled (T=1) "
          "| final mean return, greedy | final invalid actions, greedy | critic explained variance, last 10 iters "
          "| wall time per run (min) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in VARIANTS:
        evs, walls, evars = [], [], []
        for path in sorted((out / name).glob("seed*/summary.json")):
            summary = json.loads(path.read_text())
            evs.append(summary["eval"])
            walls.append(summary["wall_s"] / 60)
            metrics = path.parent / "metrics.jsonl"
            ev_log = [r["losses/explained_variance"] for r in map(json.loads, metrics.read_text().splitlines())
                      if "losses/explained_variance" in r] if metrics.is_file() else []
            if ev_log:
                evars.append(statistics.mean(ev_log[-10:]))
        if not evs:
            continue

        def col(tag: str, key: str = "success_rate") -> str:
            xs = [e[tag][key] for e in evs if tag in e]
            return _spread(xs) if xs else "-"

        print(f"| {name} ({len(evs)} seeds) | {col('bc')} | {col('final')} | {col('bc_sampled')} | "
              f"{col('final_sampled')} | {col('final', 'return_mean')} | {col('final', 'invalid_action_rate')} "
              f"| {_spread(evars) if evars else '-'} "
              f"| {statistics.mean(walls):.1f} |")

if __name__ == "__main__":
    main()
