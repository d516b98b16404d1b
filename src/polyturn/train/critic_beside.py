"""The separate critic's update, in line or beside the next iteration's sampling (``run.critic_beside``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from polyturn.config import TrainConfig
from polyturn.runtime import Runtime
from polyturn.train import distributed
from polyturn.train.critics import CriticLearner


def timed_update(update: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run the critic's ``update``; its metrics and wall time."""
    t = time.perf_counter()
    metrics = update()
    return {**metrics, "perf/update_critic_s": time.perf_counter() - t}


class CriticBeside:
    """Runs a critic's update in line, or on a thread beside the next iteration's sampling, then completes its
    iteration (logs it) when joined.

    Beside only where that changes nothing but the time and the thread count: a critic whose update never reads the
    actor (``update_apart``), on the CPU, in one process that samples itself without reading the critic (no
    ``rollout.best_of``), and with the cores for both (``run.train_threads`` at least twice ``run.rollout_threads``;
    each side gets ``rollout_threads``).
    """

    def __init__(self, cfg: TrainConfig, critic: CriticLearner, runtime: Runtime, *, alone: bool = True) -> None:
        run = cfg.run
        self.cfg = cfg
        # alone: the run's only critic (with several policies each critic updates in line).
        self.beside = (alone and run.critic_beside and critic.update_apart and runtime.device.type == "cpu"
                       and not distributed.active() and not cfg.rollout.workers
                       and run.train_threads >= 2 * run.rollout_threads
                       and cfg.rollout.best_of == 1)  # a best-of scorer reads the critic while sampling
        self._pool: ThreadPoolExecutor | None = None
        self._job: tuple[Future, Callable[[dict[str, float]], None]] | None = None

    def run(self, update: Callable[[], dict[str, float]] | None, close: Callable[[dict[str, float]], None]) -> None:
        """Beside: start ``update`` on the critic's thread; ``close`` gets its metrics when :meth:`finish` joins it.
        In line: the update ran before the actor's (the trainer asked :attr:`beside` first), so ``close`` now."""
        if not self.beside or update is None:
            close({})
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="polyturn-critic")
        # torch's thread count is the process's, not a thread's: the update and the sampling beside it each run
        # with rollout_threads (set here, before either starts, so neither changes it under the other).
        torch.set_num_threads(self.cfg.run.rollout_threads)
        self._job = (self._pool.submit(timed_update, update), close)

    def finish(self) -> None:
        """Wait for the update running beside sampling (if any), then complete its iteration.

        Everything that reads the critic or the finished iteration calls this first: the next values, evaluations,
        checkpoints and the end of the run. The update's own errors are raised here.
        """
        if self._job is None:
            return
        job, close = self._job
        self._job = None
        t = time.perf_counter()
        critic_metrics = job.result()
        close({**critic_metrics, "perf/critic_wait_s": time.perf_counter() - t})

    def close(self) -> None:
        """Let a running update end (an error in the loop leaves the critic consistent), then stop its thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._job = None
