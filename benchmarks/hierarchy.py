"""Flat against hierarchical agents (issue 59, docs/hierarchy.md): held-out success overall, on the long-horizon
tasks and on the short ones, by group, at the env steps and wall time each run spent.

Each run directory is one arm and seed (``--flat DIR ...``, ``--hier DIR ...``, the same seeds in the same order).
Long-horizon tasks: SQL levels ``--long-levels`` (default 4 5); CustomerService's multi-step intents
``--long-intents`` (default change_address return exchange). The runs, e.g. on SQL (tiny actor)::

    for s in 0 1 2; do
      polyturn train --config configs/sql_tiny.yaml --set run.seed=$s --set run.out_dir=runs/h/sql_flat_s$s
      polyturn train --config configs/sql_tiny.yaml --set run.seed=$s --set run.out_dir=runs/h/sql_hier_s$s \\
          --set 'hierarchy={k: 4}'
    done
    python benchmarks/hierarchy.py --flat runs/h/sql_flat_s{0,1,2} --hier runs/h/sql_hier_s{0,1,2}

``--quick`` trains the smallest pair itself (configs/test_tiny.yaml on SQL, one RL iteration each, into
``--quick-dir``) and reports it: that the script runs, not a measurement.

Env steps: the RL phase's worker turns that stepped the env (a hierarchical run's ``subgoal_done`` turns and its
manager's turns are not env steps); wall time: the run's phases from ``summary.json``. Per arm: the mean over seeds
+- their standard deviation, and the per-seed values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.registry import env_spec
from polyturn.train.logger import read_metrics


def group_of(record: dict, *, long_levels: set[int], long_intents: set[str]) -> str:
    """``long`` or ``short`` for one held-out record (by SQL level or CustomerService intent)."""
    breakdowns = env_spec(record["env_id"]).breakdowns
    if "intent" in breakdowns:
        return "long" if breakdowns["intent"](record) in long_intents else "short"
    return "long" if int(record.get("level", 0)) in long_levels else "short"


def run_figures(run: Path, *, long_levels: set[int], long_intents: set[str], tag: str) -> dict:
    """One run's held-out success (all, long, short, by group), its RL env steps and its wall time."""
    records = list(read_jsonl(run / f"eval_{tag}.jsonl"))
    if not records:
        raise SystemExit(f"{run}: no eval_{tag}.jsonl records")
    out: dict = {"success": statistics.fmean(bool(r["success"]) for r in records)}
    for g in ("long", "short"):
        mine = [r for r in records if group_of(r, long_levels=long_levels, long_intents=long_intents) == g]
        out[g] = statistics.fmean(bool(r["success"]) for r in mine) if mine else None
        out[f"{g}_n"] = len(mine)
    breakdowns = env_spec(records[0]["env_id"]).breakdowns
    by = breakdowns["intent"] if "intent" in breakdowns else (lambda r: f"level {r.get('level', 0)}")
    groups: dict[str, list[bool]] = {}
    for r in records:
        groups.setdefault(by(r), []).append(bool(r["success"]))
    out["by_group"] = {k: f"{sum(v)}/{len(v)}" for k, v in sorted(groups.items())}
    steps = 0.0
    for m in read_metrics(run / "metrics.jsonl"):
        if m.get("phase") not in ("warmup", "mixed", "ppo"):
            continue
        if "hierarchy/env_steps" in m:
            steps += float(m["hierarchy/env_steps"])
        elif "charts/turns_mean" in m:
            steps += float(m["charts/turns_mean"]) * float(m.get("charts/episodes", 0.0))
    out["env_steps"] = steps
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    out["wall_min"] = sum(summary.get("phase_s", {}).values()) / 60 if summary else None
    return out


def quick_runs(root: Path) -> tuple[list[Path], list[Path]]:
    """A tiny flat and a tiny hierarchical SQL run (configs/test_tiny.yaml, one RL iteration each) under ``root``."""
    from polyturn.config import load_config
    from polyturn.train.trainer import Trainer

    runs = []
    for arm, extra in (("flat", []), ("hier", ["hierarchy={k: 3}"])):
        out = root / arm
        cfg = load_config(Path(__file__).parents[1] / "configs" / "test_tiny.yaml", [
            f"run.out_dir={out}", "env.id=polyturn/SQLAnalyst-v0", "bc.episodes=4", "curriculum.warmup_iters=0",
            "curriculum.mixed_iters=1", "curriculum.ppo_iters=0", "env.eval_episodes=4", "ppo.episodes_per_iter=4",
            "rollout.num_envs=4", *extra])
        Trainer(cfg, overwrite=True).run()
        runs.append([out])
    return runs[0], runs[1]


def _cell(values: list[float | None], fmt: str = "{:.3f}") -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{fmt.format(statistics.fmean(vals))} ± {fmt.format(sd)} ({', '.join(fmt.format(v) for v in vals)})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flat", nargs="+", type=Path, help="flat runs, one per seed")
    ap.add_argument("--hier", nargs="+", type=Path, help="hierarchical runs, the same seeds")
    ap.add_argument("--quick", action="store_true", help="train a tiny flat and hierarchical run and report them")
    ap.add_argument("--quick-dir", type=Path, default=Path("runs/hierarchy_quick"), help="where --quick trains")
    ap.add_argument("--tag", default="final", help="which evaluation (eval_<tag>.jsonl): final, bc, ...")
    ap.add_argument("--long-levels", nargs="*", type=int, default=[4, 5])
    ap.add_argument("--long-intents", nargs="*", default=["change_address", "return", "exchange"])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    if a.quick:
        a.flat, a.hier = quick_runs(a.quick_dir)
    if not a.flat or not a.hier:
        ap.error("expected --flat and --hier runs (or --quick)")
    if len(a.flat) != len(a.hier):
        ap.error(f"expected as many flat runs as hierarchical ones (one per seed), got {len(a.flat)} and {len(a.hier)}")
    kw = {"long_levels": set(a.long_levels), "long_intents": set(a.long_intents), "tag": a.tag}
    figures = {arm: [run_figures(r, **kw) for r in runs] for arm, runs in (("flat", a.flat), ("hier", a.hier))}
    print(f"held-out ({a.tag}): mean ± sd over {len(a.flat)} seeds (per seed)")
    print(f"{'':8} {'success':>30} {'long-horizon':>30} {'short':>30} {'RL env steps':>30} {'wall min':>26}")
    for arm, rows in figures.items():
        print(f"{arm:8} " + " ".join([_cell([r["success"] for r in rows]), _cell([r["long"] for r in rows]),
                                      _cell([r["short"] for r in rows]),
                                      _cell([r["env_steps"] for r in rows], "{:.0f}"),
                                      _cell([r["wall_min"] for r in rows], "{:.1f}")]))
    for arm, rows in figures.items():
        for run, r in zip(a.flat if arm == "flat" else a.hier, rows):
            print(f"{arm} {run}: " + ", ".join(f"{k} {v}" for k, v in r["by_group"].items()))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
