"""Run logs: one JSONL line per update (and TensorBoard scalars), with fixed metric names.

Names follow CleanRL's habit of ``group/name``: ``charts/success_rate``,
``losses/policy_loss``, ``losses/approx_kl``, ``reward/<term>``, ``perf/turns_per_s``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from polyturn.acting.jsonl import append_jsonl, read_jsonl, write_jsonl


class RunLogger:
    """Appends metric dicts to ``metrics.jsonl`` (resumable) and mirrors scalars to TensorBoard."""

    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out_dir / "tb"))
            except ImportError:  # tensorboard is a declared dependency; tolerate its absence in odd installs
                self._tb = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Write one record; non-finite floats are kept as strings so the line stays valid JSON."""
        rec: dict[str, Any] = {"step": step, "time": time.time()}
        for k, v in metrics.items():
            if isinstance(v, float) and not math.isfinite(v):
                rec[k] = str(v)
            else:
                rec[k] = v
        append_jsonl(self.path, rec)
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def drop_from_iter(self, it: int, *, evals: tuple[str, ...] = ()) -> None:
        """On resume, drop RL records of iterations >= ``it`` and the records of the held-out evaluations ``evals``
        (``bc``: phase ``eval_bc``; they will be run again), keeping everything else."""
        if not self.path.is_file():
            return
        drop = {"eval_final", *(f"eval_{tag}" for tag in evals)}
        keep = [r for r in read_jsonl(self.path) if r.get("iter", -1) < it and r.get("phase") not in drop]
        write_jsonl(self.path, keep)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` (a bad line raises ``ValueError`` naming it)."""
    return read_jsonl(path)
