"""The ``polyturn`` command: demos, play, train (and evaluate, make-test-cases, rate, judge, diagnose, serve, ...).

User mistakes end with a one-line error and exit status 2, never a traceback:

* an argument's value is checked by its ``type`` (:mod:`polyturn.argtypes`:
  :data:`positive_int`, :data:`probability` ...), so argparse reports it;
* a mistake found later (an unknown env id, a missing or malformed file, a bad
  config value) raises one of :data:`USER_ERRORS` with an "Expected X, got Y"
  message, which :func:`main` prints as one ``error:`` line.

A subcommand is its arguments in :mod:`polyturn.cli.parser` and a module here
with ``run(args) -> int`` (``polyturn train`` is :mod:`polyturn.cli.train`),
named in :data:`COMMANDS`. A command's module is imported only when that
command runs, so ``polyturn --help`` loads no torch, transformers or FastAPI.
This package is the composition root: it may import every layer.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from polyturn.cli.parser import build_parser
from polyturn.config import ConfigError

USER_ERRORS = (ConfigError, OSError, ValueError, KeyError)

#: The module that runs each subcommand (its ``run(args) -> int``), imported when that command runs.
COMMANDS: dict[str, str] = {
    "demos": "polyturn.cli.demos",
    "play": "polyturn.cli.play",
    "train": "polyturn.cli.train",
    "evaluate": "polyturn.cli.evaluate",
    "make-test-cases": "polyturn.cli.make_test_cases",
    "rate": "polyturn.cli.rate",
    "judge": "polyturn.cli.judge",
    "diagnose": "polyturn.cli.diagnose",
    "tournament": "polyturn.cli.tournament",
    "serve": "polyturn.cli.serve",
}


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command line: import ``args.command``'s module and return its ``run(args)``; errors propagate."""
    return int(importlib.import_module(COMMANDS[args.command]).run(args) or 0)


def _quiet_libraries() -> None:
    """transformers draws its own progress bars when saving and loading; polyturn shows its own."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging  # heavy: after parsing, so --help never loads it

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
        return run_command(args)
    except USER_ERRORS as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {escape(_one_line(e))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return 130

