"""How much of its decision tree does a set of demonstrations show, turn by turn?

Behaviour cloning learns, at each state, the action the demonstrations took there. This counts, for each turn
index, the distinct states the demonstrations reach (a state: the observations so far, exactly as written),
how many demonstrations pass through each, and at how many states the demonstrations disagree (more than one
distinct action: the expert's noise, or an expert that reads more than the text). Run by hand on a
``demos.jsonl`` or on demonstrations generated here, e.g. Twenty Questions' exact and noisy experts::

    .venv/bin/python benchmarks/demo_tree.py --env polyturn/TwentyQuestions-v0 --episodes 96 \\
        --env-kwargs '{"list_candidates": 8}' --noise 0 0.3
    .venv/bin/python benchmarks/demo_tree.py --demos runs/tq_smollm2_list8/demos.jsonl

An exact expert that reads only the text is a tree: at turn t at most 2**t states when each observation is
one of two answers, every state's demonstrations agreeing. ``--quick``: Twenty Questions, 16 episodes.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from polyturn.acting.episodes import generate_demos
from polyturn.acting.jsonl import read_jsonl


def tree(records: Iterable[Mapping[str, Any]], depth: int) -> list[dict[str, float]]:
    """Per turn index ``t < depth``: demonstrations that reached it, distinct states (observations up to turn
    ``t``), demonstrations per state, and states whose demonstrations took more than one action."""
    actions: list[dict[tuple[str, ...], set[str]]] = [defaultdict(set) for _ in range(depth)]
    visits: list[int] = [0] * depth
    for rec in records:
        seen: tuple[str, ...] = ()
        for t, turn in enumerate(rec["turns"][:depth]):
            seen = (*seen, turn["observation"])
            actions[t][seen].add(turn["action"])
            visits[t] += 1
    return [{"turn": t, "demos": visits[t], "states": len(actions[t]),
             "per_state": visits[t] / max(1, len(actions[t])),
             "conflicting": sum(len(a) > 1 for a in actions[t].values())} for t in range(depth) if visits[t]]


def print_tree(name: str, records: list[Mapping[str, Any]], depth: int) -> None:
    rows = tree(records, depth)
    ok = sum(bool(r.get("success")) for r in records)
    turns = sum(len(r["turns"]) for r in records) / max(1, len(records))
    print(f"\n{name}: {len(records)} demonstrations, {ok} successful, {turns:.1f} turns each")
    print("| turn | demonstrations there | distinct states | demonstrations per state | states with >1 action |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['turn']} | {r['demos']} | {r['states']} | {r['per_state']:.1f} | {r['conflicting']} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demos", nargs="+", default=[], help="demos.jsonl files (as polyturn train writes them)")
    p.add_argument("--env", help="generate demonstrations of this env's scripted expert instead")
    p.add_argument("--episodes", type=int, default=96)
    p.add_argument("--noise", type=float, nargs="+", default=[0.0], help="expert noise levels, one table each")
    p.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments of the env")
    p.add_argument("--expert-options", default="{}", help="JSON keyword options of the expert")
    p.add_argument("--seed", type=int, default=0, help="first task seed (episode i plays seed + i)")
    p.add_argument("--depth", type=int, default=8, help="turns counted")
    p.add_argument("--quick", action="store_true", help="Twenty Questions, 16 episodes, exact and noisy (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.env, args.episodes, args.noise, args.depth = "polyturn/TwentyQuestions-v0", 16, [0.0, 0.3], 4
    if args.episodes < 1 or args.depth < 1:
        p.error("--episodes and --depth must be >= 1")
    if not args.demos and not args.env:
        p.error("give --demos FILE... or --env ENV_ID")
    try:
        env_kwargs, options = json.loads(args.env_kwargs), json.loads(args.expert_options)
    except json.JSONDecodeError as e:
        p.error(f"--env-kwargs / --expert-options: not JSON ({e})")
    for path in args.demos:
        if not Path(path).is_file():
            p.error(f"--demos {path}: no such file")
        print_tree(path, read_jsonl(path), args.depth)
    if args.env:
        for noise in args.noise:
            try:
                recs = list(generate_demos(args.env, episodes=args.episodes, noise=noise, seed=args.seed,
                                           env_kwargs=env_kwargs, expert_options=options))
            except ValueError as e:  # an unknown env id, bad env kwargs or expert options
                raise SystemExit(f"--env {args.env}: {e}") from None
            print_tree(f"{args.env}, expert noise {noise}", recs, args.depth)


if __name__ == "__main__":
    main()
