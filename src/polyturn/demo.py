"""``make demo``: train a small agent on CPU and show it improve.

Runs ``configs/sql_tiny.yaml`` through all four phases (noisy demonstrations ->
BC -> critic warm-up -> mixed BC+PPO -> PPO) on ``polyturn/SQLAnalyst-v0``,
then prints held-out success of the BC policy and of the final policy side by
side, and one transcript of the final policy. Each run writes a new directory
under ``runs/demo/`` (nothing earlier is overwritten).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from polyturn.acting.episodes import format_transcript
from polyturn.acting.jsonl import read_jsonl
from polyturn.cli import _quiet_libraries
from polyturn.config import ConfigError, load_config
from polyturn.console import RichReporter
from polyturn.runtime import describe_machine
from polyturn.train.trainer import Trainer


def results_table(ev: dict) -> Table:
    """BC vs final on the held-out tasks, greedy and (if evaluated) sampled."""
    t = Table(title="Held-out tasks (seeds never seen in training)")
    t.add_column("policy")
    t.add_column("success (greedy)", justify="right")
    t.add_column("success (sampled)", justify="right")
    t.add_column("mean return", justify="right")
    t.add_column("mean turns", justify="right")
    t.add_column("invalid actions", justify="right")
    for tag, name in (("bc", "BC (phase 1)"), ("final", "final (after RL)")):
        g = ev.get(tag)
        if g is None:
            continue
        s = ev.get(f"{tag}_sampled")
        t.add_row(name, f"{g['success_rate']:.3f}", f"{s['success_rate']:.3f}" if s else "-",
                  f"{g['return_mean']:+.2f}", f"{g['turns_mean']:.2f}", f"{g['invalid_action_rate']:.3f}")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polyturn.demo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/sql_tiny.yaml")
    p.add_argument("--out", default=None, help="run directory (default: runs/demo/<timestamp>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    _quiet_libraries()
    con = Console()
    out = args.out or f"runs/demo/{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        cfg = load_config(args.config, [*args.set, f"run.out_dir={out}"])
    except ConfigError as e:
        con.print(f"error: {e}", markup=False)
        return 2
    con.print(f"polyturn demo: {cfg.actor.preset} actor ({cfg.actor.hidden}x{cfg.actor.layers}), "
              f"{cfg.critic.kind} critic (privileged={cfg.critic.privileged}) on {cfg.env.id}; run dir {out}",
              markup=False)
    rep = RichReporter(every=1)
    t0 = time.time()
    try:
        summary = Trainer(cfg, reporter=rep).run()
    finally:
        rep.close()
    con.print(results_table(summary["eval"]))
    ev = summary["eval"]
    gain = ev["final"]["success_rate"] - ev["bc"]["success_rate"]
    con.print(f"RL changed greedy held-out success by {100 * gain:+.1f} points "
              f"over {ev['final']['episodes']} tasks in {(time.time() - t0) / 60:.1f} min.")
    con.print(f"Machine: {describe_machine(summary['machine'])}.", markup=False)  # timings differ between machines
    wins = [r for r in read_jsonl(Path(out) / "eval_final.jsonl") if r["success"]]
    if wins:
        con.print("\nOne held-out episode of the final policy:\n", markup=False)
        con.print(format_transcript(wins[0]), markup=False, highlight=False)
    (Path(out) / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
