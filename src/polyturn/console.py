"""The one place polyturn draws to the terminal: rich progress bars and per-update metric lines."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# The per-update line: the standard diagnostics, in a fixed order, when present.
LINE_KEYS = [
    ("charts/success_rate", "succ", "{:.2f}"),
    ("charts/return_mean", "ret", "{:+.2f}"),
    ("charts/turns_mean", "turns", "{:.1f}"),
    ("rft/kept", "kept", "{:.0f}"),  # ppo.algo rft: the successful episodes imitated
    ("losses/policy_loss", "pg", "{:+.3f}"),
    ("losses/value_loss", "vf", "{:.3f}"),
    ("losses/approx_kl", "kl", "{:.4f}"),
    ("losses/declined_approx_kl", "kl_declined", "{:.3g}"),  # a minibatch the KL limit did not step
    ("losses/clipfrac", "clip", "{:.3f}"),
    ("losses/entropy", "ent", "{:.3f}"),
    ("losses/explained_variance", "ev", "{:+.2f}"),
    ("critic/pair_acc", "pair_acc", "{:.2f}"),  # critic.kind action: held-out pairwise accuracy
    ("critic/pair_acc_first_diff", "pair_acc1", "{:.2f}"),
    ("critic/branch_acc", "branch_acc", "{:.2f}"),  # critic.branch_states: turn pairs from one state
    ("losses/dpo_loss", "dpo", "{:.3f}"),  # ppo.algo turn_dpo
    ("losses/bc_loss", "bc", "{:.3f}"),
    ("bc/token_accuracy", "acc", "{:.3f}"),
    ("perf/turns_per_s", "turns/s", "{:.1f}"),
    ("perf/tokens_per_s", "tok/s", "{:.0f}"),
    ("eval/success_rate", "succ", "{:.3f}"),
    ("eval/return_mean", "ret", "{:+.2f}"),
]


def metric_line(phase: str, step: int, m: dict[str, Any], *, terms: bool = True) -> str:
    """A compact one-line summary of an update's metrics."""
    parts = [f"[{phase} {step}]"]
    for key, short, fmt in LINE_KEYS:
        v = m.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{short}={fmt.format(v)}")
    if terms:
        rt = {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("reward/") and abs(v) > 1e-9}
        if rt:
            parts.append("terms{" + " ".join(f"{k}={v:+.2f}" for k, v in rt.items()) + "}")
    return " ".join(parts)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


class RichReporter:
    """Progress bars for each phase and one metric line per update.

    Rich redraws a bar only on a terminal; written to a file (``nohup ... > log``) it would show each bar once,
    when the run ends. There, each phase instead prints a plain line at its start, at every tenth of its total
    and at least every ``log_interval`` seconds: ``[progress] bc 12/48 (25%) elapsed 0:09:12 eta 0:27:36``.

    A step of a phase can be long too (a SmolLM2 RL iteration samples for ten minutes or more): :meth:`sub` counts
    inside it. On a terminal that is a second bar under the phase's, gone when the step ends; in a log file a line
    ``[progress] rl 0/5: sampling 31/48 elapsed 0:06:10`` when ``log_interval`` seconds have passed since the last
    line, and at its end if it wrote one, so a fast step (the demo's iterations) adds none.
    """

    def __init__(self, console: Console | None = None, *, every: int = 1, log_interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(stderr=True)
        self.every = every
        self.plain = not self.console.is_terminal
        self.log_interval = log_interval
        self._clock = clock
        self._name, self._total, self._done = "", 0, 0
        self._t0 = self._last_t = 0.0
        self._last_tenth = 0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False, disable=self.plain,
        )
        self.progress.start()
        self.task = None
        self._sub_task = None

    def start(self, name: str, total: int) -> None:
        self._drop_sub()
        if self.task is not None:
            self.progress.update(self.task, visible=False)
            self.progress.stop_task(self.task)
        self.task = self.progress.add_task(name, total=total or None) if total else None
        if self.plain and total:
            self._name, self._total, self._done, self._last_tenth = name, total, 0, 0
            self._t0 = self._last_t = self._clock()
            self._plain_line()

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)
            if self.plain:
                self._done += n
                now, tenth = self._clock(), 10 * self._done // self._total
                if tenth > self._last_tenth or now - self._last_t >= self.log_interval:
                    self._last_tenth, self._last_t = tenth, now
                    self._plain_line(now)

    def _plain_line(self, now: float | None = None) -> None:
        elapsed = (now if now is not None else self._clock()) - self._t0
        line = f"[progress] {self._name} {self._done}/{self._total} ({100 * self._done // self._total}%)"
        line += f" elapsed {_clock(elapsed)}"
        if 0 < self._done < self._total:
            line += f" eta {_clock(elapsed * (self._total - self._done) / self._done)}"
        self.console.print(line, markup=False, highlight=False)

    def sub(self, name: str, total: int) -> Callable[[int], None]:
        """Progress inside the current phase's step (``name``, ``total`` units, e.g. episodes); returns its
        ``advance(n)``."""
        self._drop_sub()
        if not self.plain:
            self._sub_task = self.progress.add_task(f"  {name}", total=total or None)
            return functools.partial(self.progress.advance, self._sub_task)
        t0, done, said = self._clock(), 0, False

        def advance(n: int = 1) -> None:
            nonlocal done, said
            done += n
            now = self._clock()
            # A slow step (a line of its own and as long as the interval) also says when it ended.
            if now - self._last_t >= self.log_interval or (said and done == total and now - t0 >= self.log_interval):
                self._last_t, said = now, True
                line = f"[progress] {self._name} {self._done}/{self._total}: {name} {done}/{total}"
                self.console.print(f"{line} elapsed {_clock(now - t0)}", markup=False, highlight=False)

        return advance

    def _drop_sub(self) -> None:
        if self._sub_task is not None:
            self.progress.remove_task(self._sub_task)
            self._sub_task = None

    def metrics(self, phase: str, step: int, metrics: dict[str, Any]) -> None:
        if phase.startswith("eval") or step % self.every == 0:
            self.progress.console.print(metric_line(phase, step, metrics), markup=False, highlight=False)

    def message(self, text: str) -> None:
        self.progress.console.print(text, style="yellow", markup=False, highlight=False)

    def close(self) -> None:
        self._drop_sub()
        self.progress.stop()
