"""``polyturn evaluate``: run policies on test cases and write a comparison report."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from polyturn.acting.policies import resolve_policy
from polyturn.cli import evaluate_offline
from polyturn.console import RichReporter
from polyturn.eval.runner import evaluate
from polyturn.eval.testcases import load_test_cases


def run(args: argparse.Namespace) -> int:
    """Evaluate every ``--policy_checkpoint`` on ``--test_cases``; print each success rate and where the report is."""
    if args.offline:
        return evaluate_offline.run(args)
    if not args.policy_checkpoint or not args.test_cases:
        raise ValueError("Expected --policy_checkpoint DIR... and --test_cases FILE (run policies on test cases), or "
                         "--offline DATA --policy DIR (estimate a checkpoint on recorded sessions), got neither")
    console = Console(stderr=True)
    n_cases = len(load_test_cases(args.test_cases))
    for policy in args.policy_checkpoint:  # fail on a bad path before any work starts
        resolve_policy(policy)
    rep = RichReporter(console)
    rep.start("evaluate", n_cases * len(args.policy_checkpoint))
    try:
        data = evaluate(args.policy_checkpoint, args.test_cases, out_dir=args.out, visualize=args.visualize,
                        temperature=args.temperature, seed=args.seed, num_envs=args.num_envs, progress=rep.advance,
                        baseline=args.baseline, compare_to=args.compare,
                        embedder=None if args.embedder == "none" else "minilm", best_of=args.best_of,
                        critic=args.critic, oracle=args.oracle)
    finally:
        rep.close()
    for p in data.policies:
        v = data.values[p]["success_rate"]
        console.print(escape(f"{p}: success {v.value:.3f} [{v.lo:.3f}, {v.hi:.3f}] over {v.n} episodes"))
    out = Path(args.out)
    console.print(f"wrote {out / 'report.md'}" + (f" and {out / 'report.html'}" if args.visualize else ""))
    return 0
