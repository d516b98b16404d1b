"""What every benchmark's ``--quick`` mode measures on: a run of ``configs/test_tiny.yaml`` (all four phases, seconds).

``--quick`` runs a benchmark end to end at the smallest size, so ``tests/test_benchmarks.py`` can run each one
and none rots unnoticed; its figures mean nothing. The tiny run is trained once into ``$POLYTURN_QUICK_RUN``
(default: a directory under the system's temporary directory) and reused by the benchmarks that need a
checkpoint or a run directory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "test_tiny.yaml"


def tiny_run(out: str | os.PathLike[str] | None = None) -> Path:
    """The run directory of a finished ``configs/test_tiny.yaml`` training (``ckpt-bc``, ``ckpt-final``,
    ``demos.jsonl``, ``eval_*.jsonl``), trained now unless ``out`` already holds one."""
    from polyturn.cli import _quiet_libraries
    from polyturn.config import load_config
    from polyturn.train.trainer import Trainer

    run = Path(out or os.environ.get("POLYTURN_QUICK_RUN") or Path(tempfile.gettempdir()) / "polyturn-quick-run")
    if not (run / "summary.json").is_file():
        _quiet_libraries()
        Trainer(load_config(TINY_CONFIG, [f"run.out_dir={run}"]), overwrite=True).run()  # an unfinished one restarts
    return run


def polyturn(*args: str, sets: Sequence[str] = ()) -> None:
    """``polyturn ARGS --set S ...`` in this process, for benchmarks that chain commands (their runs are sequential,
    and one interpreter saves each command's start-up); its own report goes to its run's log, not the benchmark's
    output. A command that fails stops the benchmark (its message is printed above)."""
    import contextlib
    import io

    from polyturn.cli import main as cli

    argv = [*args]
    for s in sets:
        argv += ["--set", s]
    print("$ polyturn " + " ".join(argv), flush=True)
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli(argv)
    if code != 0:
        raise SystemExit(f"polyturn {args[0]} failed (exit status {code}): the message is above")
