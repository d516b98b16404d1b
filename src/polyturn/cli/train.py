"""``polyturn train``: BC -> critic warm-up -> mixed -> PPO from a YAML config, in one process or K under torchrun."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from rich.console import Console

from polyturn.config import load_config
from polyturn.runtime import describe_machine

# The trainer (transformers and the rest: ~6 s of imports on a 2-core CPU) loads in run(), after the config is
# checked: a config mistake is a one-line error in ~2 s.


def _launch_torchrun(args: argparse.Namespace) -> int:
    """``polyturn train --nproc K``: the same command as K data-parallel processes under torchrun."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           "-m", "polyturn.cli", "train", "--log-every", str(args.log_every)]
    if args.config:
        cmd += ["--config", args.config]
    for kv in overrides(args):
        cmd += ["--set", kv]
    if args.resume:
        cmd.append("--resume")
    if args.overwrite:
        cmd.append("--overwrite")
    return subprocess.run(cmd, check=False).returncode


def overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides, with ``--offline DATA ...`` as ``offline.data`` (YAML flow list, paths quoted)."""
    extra = [f"offline.data={json.dumps(list(args.offline))}"] if args.offline else []
    return [*(args.set or []), *extra]


def run(args: argparse.Namespace) -> int:
    """Train from ``--config`` with ``--set`` overrides; print the held-out success and the wall time per phase."""
    cfg = load_config(args.config, overrides(args))  # checked before any process starts
    if args.nproc > 1:
        return _launch_torchrun(args)
    from polyturn.console import RichReporter
    from polyturn.train import distributed
    from polyturn.train.reporting import NullReporter
    from polyturn.train.trainer import Trainer

    # Under torchrun rank 0 reports; the others train quietly (polyturn.train.distributed).
    quiet = distributed.setup(cfg.run.device) and distributed.rank() != 0
    rep = None if quiet else RichReporter(every=args.log_every)
    try:
        summary = Trainer(cfg, reporter=rep or NullReporter(), resume=args.resume, overwrite=args.overwrite).run()
    finally:
        if rep is not None:
            rep.close()
        distributed.close()
    if quiet:
        return 0
    ev = summary["eval"]
    con = Console()
    shown = [k for k in ("bc", "offline", "final") if k in ev]
    if "final" in ev and len(shown) > 1:
        con.print(f"held-out success ({ev['final']['episodes']} tasks): "
                  + " -> ".join(f"{'BC' if k == 'bc' else k} {ev[k]['success_rate']:.3f}" for k in shown))
    if summary.get("phase_s"):
        con.print("wall time per phase: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in summary["phase_s"].items())
                  + f" on {describe_machine(summary['machine'])}", markup=False)
    con.print(f"run directory: {cfg.run.out_dir}")
    return 0
