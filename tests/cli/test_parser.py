"""The ``polyturn`` parser and the command table agree, and building the parser stays light."""

from __future__ import annotations

import importlib
import subprocess
import sys

from polyturn.cli import COMMANDS, build_parser


def test_every_subcommand_has_a_module_that_runs_it():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(COMMANDS)
    for name, module in COMMANDS.items():
        assert callable(importlib.import_module(module).run), name


def test_help_loads_no_heavy_library():
    """A command's module is imported only when it runs: ``polyturn --help`` needs no torch, transformers or FastAPI."""
    code = ("import sys\nfrom polyturn.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'fastapi', 'uvicorn', "
            "'matplotlib', 'sklearn', 'peft'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
