"""``polyturn make-test-cases``: write a test-case file from a range of task seeds."""

from __future__ import annotations

import argparse

from rich.console import Console

from polyturn.eval.testcases import make_test_cases


def run(args: argparse.Namespace) -> int:
    """Write one test case per seed of ``--seeds`` (``A:B``) of ``--env`` to ``--out``."""
    cases = make_test_cases(args.env, args.seeds, args.out, env_kwargs=args.env_kwargs)
    Console(stderr=True).print(f"wrote {len(cases)} test cases to {args.out}")
    return 0
