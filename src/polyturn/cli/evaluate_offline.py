"""``polyturn evaluate --offline DATA --policy CKPT``: a checkpoint's success and return estimated on recorded
sessions, without running it (off-policy evaluation; docs/offline.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from polyturn.acting.checkpoint import load_checkpoint
from polyturn.acting.ope import OPEReport, check_records, estimate, load_value_critic, read_records


def report_lines(rep: OPEReport) -> list[str]:
    """The estimates as the command prints them."""
    pct = f"{rep.confidence:.0%}"
    by = ", ".join(f"{v}: {n}" for v, n in rep.behaviour.items())
    lines = [f"{rep.policy} on {rep.episodes} recorded episodes ({rep.turns} turns; behaviour {by})",
             f"  recorded (the behaviour's own): success {rep.recorded['success']:.3f}, return "
             f"{rep.recorded['return']:.3f}"]
    for name, e in rep.wis.items():
        lines.append(f"  per-decision WIS {name}: {e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}] ({pct} bootstrap)")
    if rep.dr is not None:
        for name, e in rep.dr.items():
            lines.append(f"  doubly robust {name}: {e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}] ({pct} bootstrap)")
    else:
        lines.append(f"  doubly robust: unavailable, {rep.dr_unavailable}")
    lines.append(f"  effective sample size {rep.ess:.1f} of {rep.episodes}; {rep.clipped:.1%} of episodes at the "
                 f"weight clip {rep.clip:g}; mean |log ratio| per turn {rep.mean_abs_log_ratio:.3f}")
    lines += [f"  note: {n}" for n in rep.notes]
    return lines


def run(args: argparse.Namespace) -> int:
    """Estimate ``--policy`` on ``--offline`` records; print the estimates and write ``<out>/offline_eval.json``."""
    if not args.policy:
        raise ValueError("--offline: Expected --policy CKPT, the checkpoint to evaluate on the records, got none")
    if args.policy_checkpoint or args.test_cases:
        raise ValueError("--offline: Expected --policy alone, got --policy_checkpoint/--test_cases too: those run "
                         "policies online; evaluate offline and online in two commands")
    console = Console(stderr=True, soft_wrap=True)
    records = read_records(args.offline)
    source = ", ".join(args.offline)
    check_records(records, source=source)  # a refusal before any model loads
    ckpt = load_checkpoint(args.policy)
    critic, why = load_value_critic(ckpt.actor_dir.parent)
    rep = estimate(ckpt.actor, records, policy=ckpt.label, critic=critic, dr_unavailable=why, clip=args.clip,
                   confidence=args.confidence, n_resamples=args.resamples, seed=args.seed, source=source)
    for line in report_lines(rep):
        console.print(escape(line), highlight=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "offline_eval.json").write_text(json.dumps(rep.to_json(), indent=2) + "\n")
    console.print(f"wrote {out / 'offline_eval.json'}")
    return 0
