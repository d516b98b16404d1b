"""Offline RL against BC on one mixed-quality dataset (issue 57; docs/offline.md, "Measured: after BC").

Per env (SQL or CustomerService, the tiny actor), the dataset is built once under ``OUT/<env>/data``: 1,000
demonstrations of a p = 0.3 noisy expert, 500 of a p = 0.9 one, and 500 episodes of a BC policy sampled at
temperature 1 on training seeds (a BC-only run on the first 1,000, evaluated on seeds 20,000-20,499; held-out tasks
start at 1,000,000; episodes with an action cut at 32 tokens are left out). Then, per seed: BC on all of it
(``--bc-epochs`` passes; the ``bc`` arm), and from that BC checkpoint each offline algorithm (``actor.init_from``;
critic fresh), with no online RL. Greedy success on the env's 200 held-out tasks, per arm: mean ± sd over the seeds
and each seed's figure. Runs whose ``summary.json`` exists are not run again.

    python benchmarks/offline_algos.py --env sql --seeds 0 1 2
    python benchmarks/offline_algos.py --env cs --seeds 0 1 2 --arms bc awr iql
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # benchmarks/quick.py

from quick import polyturn  # noqa: E402

CONFIGS = {"sql": ("configs/sql_tiny.yaml", "polyturn/SQLAnalyst-v0"),
           "cs": ("configs/customer_service_tiny.yaml", "polyturn/CustomerService-v0")}
ALGOS = {"filtered_bc": [], "awr": [], "iql": ["critic.q=true"], "cql": ["critic.q=true"]}
NO_RL = ["curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0",
         "rollout.eval_sampled_temperature=null"]
#: --quick's settings: of every run, and of the offline runs.
QUICK = ["bc.epochs=1", "env.eval_episodes=4"]
QUICK_OFFLINE = ["offline.epochs=0.5", "offline.critic_epochs=1"]


def build_data(env: str, out: Path, sets: list[str], n: int, src: Path | None = None) -> Path:
    """The dataset (built once under ``out/data``): ``n`` p = 0.3 demonstrations, ``n / 2`` p = 0.9 ones, and ``n / 2``
    episodes of the BC policy ``src`` (default: BC on the first ``n``, trained here with ``sets``) at temperature 1."""
    from polyturn.config import load_config

    cfg, env_id = CONFIGS[env]
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    if not (data / "good.jsonl").is_file():
        polyturn("demos", "--env", env_id, "--episodes", str(n), "--noise", "0.3", "--seed", "0",
                 "--out", str(data / "good.jsonl"))
    if not (data / "bad.jsonl").is_file():
        polyturn("demos", "--env", env_id, "--episodes", str(n // 2), "--noise", "0.9", "--seed", "100000",
                 "--out", str(data / "bad.jsonl"))
    src = src or out / "bc_source"
    if not (src / "summary.json").is_file():
        polyturn("train", "--config", cfg, "--overwrite",
                 sets=[f"run.out_dir={src}", f"bc.demos={data / 'good.jsonl'}", *NO_RL, *sets])
    sessions = data / "bc_sessions.jsonl"
    if not sessions.is_file():
        polyturn("make-test-cases", "--env", env_id, "--seeds", f"20000:{20000 + n // 2}",
                 "--out", str(data / "train_cases.jsonl"))
        polyturn("evaluate", "--policy_checkpoint", str(src / "ckpt-bc"), "--test_cases",
                 str(data / "train_cases.jsonl"), "--temperature", "1", "--embedder", "none",
                 "--out", str(data / "bc_eval"))
        (recorded,) = (data / "bc_eval" / "episodes").glob("*.jsonl")
        # An action that hit the token cap would be cut when tokenized as a demonstration (BC refuses data with
        # more than 2% cut actions): such episodes are left out, and counted.
        cap = load_config(cfg).rollout.max_action_tokens
        eps = [json.loads(line) for line in recorded.read_text().splitlines()]
        kept = [r for r in eps if all(t.get("n_tokens", 0) < cap for t in r["turns"])]
        sessions.write_text("".join(json.dumps(r) + "\n" for r in kept))
        print(f"BC sessions: {len(kept)} of {len(eps)} kept (the others have an action cut at {cap} tokens); "
              f"success {sum(r['success'] for r in kept) / max(1, len(kept)):.3f}", flush=True)
    every = data / "all.jsonl"
    if not every.is_file():
        with open(every, "w") as f:
            for part in ("good", "bad", "bc_sessions"):
                f.write((data / f"{part}.jsonl").read_text())
    return every


def success(run: Path, tag: str) -> float:
    return json.loads((run / "summary.json").read_text())["eval"][tag]["success_rate"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=sorted(CONFIGS), default="sql")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=["bc", *ALGOS], choices=["bc", *ALGOS])
    p.add_argument("--out", default="runs/offline")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bc-epochs", type=int, default=10,
                   help="BC's passes over the 2,000 episodes (10: the demo's optimizer steps, 20 x 1,000)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 16 + 8 + 8 episodes, 1 BC epoch, 4 tasks, "
                   "BC and filtered BC, seed 0, in $OUT or a temporary directory ($POLYTURN_QUICK_RUN: the BC source)")
    args = p.parse_args(argv)
    sets = [f"run.rollout_threads={args.threads}", f"run.train_threads={args.threads}"]
    offline_sets, src = [], None
    if args.quick:
        args.arms, args.seeds = ["bc", "filtered_bc"], [0]
        args.out = os.environ.get("OUT") or tempfile.mkdtemp(prefix="offline_algos_quick_")
        sets, offline_sets = sets + QUICK, QUICK_OFFLINE
        if os.environ.get("POLYTURN_QUICK_RUN"):  # the tests' tiny run stands in for the BC source
            src = Path(os.environ["POLYTURN_QUICK_RUN"])
    cfg, _ = CONFIGS[args.env]
    out = Path(args.out) / args.env
    every = build_data(args.env, out, sets, 16 if args.quick else 1000, src)
    results: dict[str, list[float]] = {}
    for seed in args.seeds:
        bc = out / f"bc_s{seed}"
        if not (bc / "summary.json").is_file():
            polyturn("train", "--config", cfg, "--overwrite",
                     sets=[f"run.out_dir={bc}", f"run.seed={seed}", f"bc.demos={every}", f"bc.epochs={args.bc_epochs}",
                           *NO_RL, *sets])
        for arm in args.arms:
            if arm == "bc":
                results.setdefault(arm, []).append(success(bc, "bc"))
                continue
            run = out / f"{arm}_s{seed}"
            if not (run / "summary.json").is_file():
                polyturn("train", "--config", cfg, "--overwrite", "--offline", str(every),
                         sets=[f"run.out_dir={run}", f"run.seed={seed}", f"actor.init_from={bc / 'ckpt-bc'}",
                               "run.eval_start=false", f"offline.algo={arm}", *ALGOS[arm], *NO_RL, *sets,
                               *offline_sets])
            results.setdefault(arm, []).append(success(run, "offline"))
        print(f"seed {seed}: " + ", ".join(f"{a} {v[-1]:.3f}" for a, v in results.items()), flush=True)
    print(f"\n{args.env}: greedy held-out success, mean ± sd over seeds {args.seeds} (per seed)")
    base = statistics.fmean(results["bc"]) if "bc" in results else None
    for arm, vals in results.items():
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        gap = "" if base is None or arm == "bc" else f"   vs BC {statistics.fmean(vals) - base:+.3f}"
        print(f"  {arm:12s} {statistics.fmean(vals):.3f} ± {sd:.3f} ({', '.join(f'{v:.3f}' for v in vals)}){gap}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
