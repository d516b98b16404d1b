"""The ``polyturn`` command: demos, play, train (and evaluate, make-test-cases, rate, diagnose).

User mistakes end with a one-line error and exit status 2, never a traceback:

* an argument's value is checked by its ``type`` (:mod:`polyturn.argtypes`:
  :data:`positive_int`, :data:`probability` ...), so argparse reports it;
* a mistake found later (an unknown env id, a missing or malformed file, a bad
  config value) raises one of :data:`USER_ERRORS` with an "Expected X, got Y"
  message, which :func:`main` prints as one ``error:`` line.

A subcommand is ``add_parser`` + ``set_defaults(func=handler)``, ``handler(args) -> int``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from polyturn.argtypes import json_object, non_negative_float, non_negative_int, positive_int, probability
from polyturn.config import ConfigError

USER_ERRORS = (ConfigError, OSError, ValueError, KeyError)


# ---- commands ------------------------------------------------------------------------------------
def _cmd_demos(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from polyturn.acting.episodes import generate_demos
    from polyturn.acting.jsonl import write_jsonl

    if Path(args.out).is_dir():
        raise ValueError(f"Expected --out to be a JSONL file, got the directory {args.out}")
    if args.group_shares and not args.balance_by:
        raise ValueError("Expected --balance-by with --group-shares (the breakdown that names the groups, e.g. intent)")
    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("demonstrations", total=args.episodes)
        records = list(generate_demos(args.env, episodes=args.episodes, noise=args.noise, seed=args.seed,
                                      env_kwargs=args.env_kwargs, progress=lambda n: prog.advance(task, n),
                                      expert_options=args.expert_options, balance_by=args.balance_by,
                                      group_shares=args.group_shares))
    n = write_jsonl(args.out, records)
    succ = sum(r["success"] for r in records) / max(1, len(records))
    Console().print(f"wrote {n} episodes to {args.out} (success rate {succ:.3f}, noise {args.noise})")
    return 0


def _cmd_play(args: argparse.Namespace) -> int:
    """Text policies run in :func:`polyturn.acting.episodes.run_episode`; a checkpoint's actor in the collector, greedily."""
    import torch

    from polyturn.acting.episodes import format_transcript, run_episode
    from polyturn.acting.policies import make_text_policy
    from polyturn.acting.registry import make_env, make_expert

    env = make_env(args.env, args.env_kwargs)
    try:
        if args.policy in ("expert", "noisy", "random"):
            if args.policy == "random":
                policy = make_text_policy("random", env, seed=args.seed)
            else:
                policy = make_expert(env, noise=args.noise if args.policy == "noisy" else 0.0, seed=args.seed)
            records = (run_episode(env, policy, seed=args.seed + k) for k in range(args.episodes))
        else:
            from polyturn.acting.checkpoint import load_checkpoint, run_actor

            torch.set_num_threads(1)
            ckpt = load_checkpoint(args.policy)
            eps = run_actor(ckpt.collector([env.unwrapped], env_id=args.env),
                            [{"seed": args.seed + k} for k in range(args.episodes)],
                            temperature=args.temperature, seed=args.seed, label=str(Path(args.policy)))
            records = (ep.to_record() for ep in eps)
        for record in records:
            Console().print(format_transcript(record), highlight=False)
    finally:
        env.close()
    return 0


def _launch_torchrun(args: argparse.Namespace) -> int:
    """``polyturn train --nproc K``: the same command as K data-parallel processes under torchrun."""
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           "-m", "polyturn.cli", "train", "--log-every", str(args.log_every)]
    if args.config:
        cmd += ["--config", args.config]
    for kv in args.set or []:
        cmd += ["--set", kv]
    if args.resume:
        cmd.append("--resume")
    if args.overwrite:
        cmd.append("--overwrite")
    return subprocess.run(cmd, check=False).returncode


def _cmd_train(args: argparse.Namespace) -> int:
    from polyturn.config import load_config
    from polyturn.console import RichReporter
    from polyturn.runtime import describe_machine
    from polyturn.train import distributed
    from polyturn.train.reporting import NullReporter
    from polyturn.train.trainer import Trainer

    cfg = load_config(args.config, args.set or [])  # checked before any process starts
    if args.nproc > 1:
        return _launch_torchrun(args)
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
    if "bc" in ev and "final" in ev:
        con.print(f"held-out success ({ev['final']['episodes']} tasks): BC {ev['bc']['success_rate']:.3f} -> "
                  f"final {ev['final']['success_rate']:.3f}")
    if summary.get("phase_s"):
        con.print("wall time per phase: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in summary["phase_s"].items())
                  + f" on {describe_machine(summary['machine'])}", markup=False)
    con.print(f"run directory: {cfg.run.out_dir}")
    return 0


def _critic_values(*args: Any) -> Any:
    """``polyturn diagnose``'s critic evaluator (the trainer's critics; imported only when a diagnose runs)."""
    from polyturn.train.critic_check import critic_values

    return critic_values(*args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyturn", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demos", help="write expert / noisy-expert demonstrations as JSONL")
    d.add_argument("--env", default="polyturn/SQLAnalyst-v0")
    d.add_argument("--env-kwargs", "--env_kwargs", type=json_object, default=None, metavar="JSON",
                   help="JSON object of gymnasium.make keyword arguments")
    d.add_argument("--episodes", type=non_negative_int, default=1000)
    d.add_argument("--noise", type=probability, default=0.0, help="noisy-expert error rate in [0, 1] (0 = the expert)")
    d.add_argument("--seed", type=non_negative_int, default=0)
    d.add_argument("--expert-options", type=json_object, default=None, metavar="JSON",
                   help='JSON object of the scripted expert\'s options, e.g. \'{"name_candidates": 6}\' for '
                        "TwentyQuestions (config: bc.expert_options)")
    d.add_argument("--balance-by", default=None, metavar="BREAKDOWN",
                   help="group the episodes by this breakdown of the env (CustomerService: intent); with "
                        "--group-shares (config: bc.balance_by)")
    d.add_argument("--group-shares", type=json_object, default=None, metavar="JSON",
                   help='JSON object of each named group\'s share of the episodes, e.g. \'{"forbidden": 0.3}\'; '
                        "the other groups share the rest, and seeds whose group is full are skipped "
                        "(config: bc.group_shares)")
    d.add_argument("--out", required=True)
    d.set_defaults(func=_cmd_demos)

    pl = sub.add_parser("play", help="print episodes of a policy as readable transcripts")
    pl.add_argument("--env", default="polyturn/SQLAnalyst-v0")
    pl.add_argument("--env-kwargs", "--env_kwargs", type=json_object, default=None, metavar="JSON")
    pl.add_argument("--policy", default="expert", help="expert, noisy, random, or a checkpoint directory")
    pl.add_argument("--noise", type=probability, default=0.3, help="error rate of --policy noisy, in [0, 1]")
    pl.add_argument("--episodes", type=positive_int, default=1)
    pl.add_argument("--seed", type=non_negative_int, default=0)
    pl.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (checkpoints only)")
    pl.set_defaults(func=_cmd_play)

    t = sub.add_parser("train", help="BC -> critic warm-up -> mixed -> PPO from a YAML config")
    t.add_argument("--config", default=None, help="YAML config (see configs/)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. ppo.clip=0.1")
    t.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="start again in a run.out_dir that holds an earlier run (its metrics, evaluations and "
                        "checkpoints are removed first); without it such a directory is refused")
    t.add_argument("--log-every", type=positive_int, default=1, help="print a metric line every N updates")
    t.add_argument("--nproc", type=positive_int, default=1,
                   help="data-parallel processes on this machine, started with torchrun (gloo on CPU, nccl on GPU)")
    t.set_defaults(func=_cmd_train)

    from polyturn.eval.commands import add_commands

    add_commands(sub, critic_values=_critic_values)

    from polyturn.serve.cli import add_command as add_serve_command

    add_serve_command(sub)
    return p


def _quiet_libraries() -> None:
    """transformers draws its own progress bars when saving and loading; polyturn shows its own."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def _one_line(error: BaseException) -> str:
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.strerror}: {error.filename}"
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``polyturn`` command; returns the exit status (2 for a user's mistake)."""
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {escape(_one_line(e))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
