"""Value pre-training on the demo's online RL (issue 57; docs/offline.md, "Measured: value pre-training").

Two arms per seed, both ``make demo``'s run (``configs/sql_tiny.yaml``: BC -> critic warm-up -> mixed -> PPO):

    demo        as it is: the critic starts from scratch at the warm-up;
    pretrained  the same, with the critic's V first regressed on a recorded dataset's lambda-returns after BC
                (``--offline DATA --set offline.algo=none --set offline.value_pretrain=true --set
                offline.after_bc=true``); the actor is untouched, so both arms' BC policies are the same.

The dataset is ``benchmarks/offline_algos.py``'s (2,000 SQL episodes: noisy demonstrations and BC sessions), built
by it when missing. Printed per arm, mean ± sd over the seeds (and each seed): greedy held-out success of BC and of the
final policy, the critic's explained variance over the first 20 RL iterations (warm-up and mixed) and over all of
them, and the pre-training's held-out explained variance. Runs whose ``summary.json`` exists are not run again.

    python benchmarks/value_pretrain.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # benchmarks/quick.py, offline_algos.py

from offline_algos import QUICK, build_data  # noqa: E402
from quick import TINY_CONFIG, polyturn, tiny_run  # noqa: E402

ARMS = {"demo": [], "pretrained": ["offline.algo=none", "offline.value_pretrain=true", "offline.after_bc=true"]}
#: The RL iterations whose critic explained variance is averaged first (the demo's 4 warm-up + 16 mixed).
EARLY = 20


def figures(run: Path) -> dict[str, float]:
    """A finished run's held-out success (BC, final), its critic's mean RL explained variance (first ``EARLY``
    iterations, all), and the offline phase's held-out explained variance (nan without one)."""
    ev = json.loads((run / "summary.json").read_text())["eval"]
    rl, pre = [], float("nan")
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("phase") in ("warmup", "mixed", "ppo") and "losses/explained_variance" in r:
            rl.append(r["losses/explained_variance"])
        if "offline/value_explained_variance" in r:
            pre = r["offline/value_explained_variance"]  # the last pass's
    return {"bc": ev["bc"]["success_rate"], "final": ev["final"]["success_rate"],
            "ev_early": statistics.fmean(rl[:EARLY]) if rl else float("nan"),
            "ev_all": statistics.fmean(rl) if rl else float("nan"), "ev_pretrain": pre}


def _cell(vals: list[float]) -> str:
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.3f} ± {sd:.3f} ({', '.join(f'{v:.3f}' for v in vals)})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--data", default=None, help="episode JSONL to pre-train on (default: offline_algos.py's SQL "
                   "dataset under --offline-out, built when missing)")
    p.add_argument("--offline-out", default="runs/offline")
    p.add_argument("--out", default="runs/value_pretrain")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a smoke run: configs/test_tiny.yaml, seed 0, pre-trained on "
                   "the demonstrations of benchmarks/quick.py's tiny run, in $OUT or a temporary directory")
    args = p.parse_args(argv)
    cfg, sets = "configs/sql_tiny.yaml", [f"run.rollout_threads={args.threads}", f"run.train_threads={args.threads}"]
    if args.quick:
        cfg, args.seeds = str(TINY_CONFIG), [0]
        args.out = os.environ.get("OUT") or tempfile.mkdtemp(prefix="value_pretrain_quick_")
        sets += QUICK
        args.data = str(tiny_run() / "demos.jsonl")
    data = Path(args.data) if args.data else build_data("sql", Path(args.offline_out) / "sql", sets, 1000)
    if not data.is_file():
        raise SystemExit(f"--data {data}: no such file")
    out = Path(args.out)
    results: dict[str, list[dict[str, float]]] = {}
    for seed in args.seeds:
        for arm in args.arms:
            run = out / f"{arm}_s{seed}"
            if not (run / "summary.json").is_file():
                offline = ["--offline", str(data)] if ARMS[arm] else []
                polyturn("train", "--config", cfg, "--overwrite", *offline,
                         sets=[f"run.out_dir={run}", f"run.seed={seed}", *ARMS[arm], *sets])
            results.setdefault(arm, []).append(figures(run))
        print(f"seed {seed}: " + ", ".join(f"{a} {v[-1]['bc']:.3f} -> {v[-1]['final']:.3f}"
                                             for a, v in results.items()), flush=True)
    print(f"\nvalue pre-training on {data} ({sum(1 for _ in open(data))} episodes), seeds {args.seeds}; "
          "mean ± sd (per seed)")
    print("| arm | BC success | final success | critic EV, first 20 iters | critic EV, all | pre-training EV |")
    print("|---|---|---|---|---|---|")
    for arm, rows in results.items():
        cells = [_cell([r[k] for r in rows]) for k in ("bc", "final", "ev_early", "ev_all")]
        pre = "—" if arm == "demo" else _cell([r["ev_pretrain"] for r in rows])
        print(f"| {arm} | " + " | ".join(cells) + f" | {pre} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
