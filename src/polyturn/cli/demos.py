"""``polyturn demos``: write expert / noisy-expert demonstrations as JSONL."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from polyturn.acting.episodes import generate_demos
from polyturn.acting.hierarchy import hierarchical_demos
from polyturn.acting.jsonl import write_jsonl


def run(args: argparse.Namespace) -> int:
    """Write ``--episodes`` episodes of the env's scripted expert, with ``--noise`` mistakes, to ``--out``."""
    if Path(args.out).is_dir():
        raise ValueError(f"Expected --out to be a JSONL file, got the directory {args.out}")
    if args.group_shares and not args.balance_by:
        raise ValueError("Expected --balance-by with --group-shares (the breakdown that names the groups, e.g. intent)")
    if args.hierarchy is not None:
        if args.group_shares:
            raise ValueError("Expected --group-shares without --hierarchy (hierarchical demonstrations are not "
                             "balanced by group yet)")
        with Progress(console=Console(stderr=True), transient=True) as prog:
            task = prog.add_task("demonstrations", total=args.episodes)
            records = list(hierarchical_demos(args.env, episodes=args.episodes, noise=args.noise, seed=args.seed,
                                              k=args.hierarchy, env_kwargs=args.env_kwargs,
                                              expert_options=args.expert_options,
                                              progress=lambda n: prog.advance(task, n)))
        n = write_jsonl(args.out, records)
        succ = sum(r["success"] for r in records if r["role"] == "worker") / max(1, args.episodes)
        Console().print(f"wrote {n} records ({args.episodes} tasks: a manager's and a worker's each) to {args.out} "
                        f"(success rate {succ:.3f}, noise {args.noise})")
        return 0
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
