"""``polyturn diagnose``: training curves, a critic check and warnings for a run.

The critic check needs the trainer's critic learners, which evaluation may not import: this command, in the
composition root, hands :func:`polyturn.train.critic_check.critic_values` to :func:`polyturn.eval.diagnose.diagnose`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from polyturn.console import RichReporter
from polyturn.eval.diagnose import diagnose, run_metrics
from polyturn.health.checks import format_warning
from polyturn.train.critic_check import critic_values


def run(args: argparse.Namespace) -> int:
    """Diagnose ``--run``: write diagnose.md and its plots, print the warnings with their remedies."""
    run_metrics(Path(args.run))  # a wrong --run fails before the progress bar starts
    console = Console(stderr=True)
    rep = RichReporter(console)
    rep.start("validation episodes", args.episodes)
    try:
        res = diagnose(args.run, checkpoint=args.checkpoint, episodes=args.episodes, out_dir=args.out,
                       progress=rep.advance, seed=args.seed, critic_values=critic_values)
    finally:
        rep.close()
    for w in res.warnings:
        console.print(escape(format_warning(w, plot_dir=res.paths["dir"])), style="yellow", highlight=False)
    if not res.warnings:
        quiet = (f"no warning over {res.iterations} RL iterations: every check is within its noise threshold "
                 "(docs/evaluation.md)")
        console.print(quiet if res.iterations else "no RL iteration in metrics.jsonl yet: nothing to check")
    for c in res.held_out:
        console.print(escape(c.summary()), highlight=False)
    if res.critic is not None:
        console.print(escape(f"critic: MSE {res.critic.mse:.4g}, explained variance "
                             f"{res.critic.explained_variance_text()}"), highlight=False)
    console.print(f"wrote {res.paths['markdown']}")
    return 0
