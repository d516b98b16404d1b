"""The trainer's side of rollout workers (``rollout.workers > 0``): what goes out when, staleness, metrics.

Synchronous (the default): each iteration's tasks go out, the learner waits for all of them, updates,
and broadcasts the new weights before the next batch is sent, so every turn is sampled by the
version it is trained at.

Asynchronous (``rollout.async: true``), with SkyRL's capacity rule for ``k = rollout.max_staleness``::

    capacity = (k + version + 1) * B - (accepted + running)

(``B`` episodes per iteration, ``version`` updates so far, ``accepted`` episodes trained on,
``running`` episodes sent and not yet trained on): batches for iterations ``it .. it + k`` are in
flight while the learner trains on ``it``, so workers keep playing during the update and a batch is
at most ``k`` versions old when it is trained on. A batch can only start with weights at least as new
as those of the update it was sent after, which is what bounds it; the check below drops any episode
with an older turn anyway (none is expected) and counts it. An episode spanning an update is finished by
the new weights (``rollout.partial: finish``; each turn records its version) or dropped and its task played
again (``drop``). PPO's importance ratio divides by the behaviour log-probs recorded at sampling, so a
stale turn is corrected by its own probabilities, never by the learner's current ones.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Literal

from polyturn.config import TrainConfig
from polyturn.rollout.types import Episode
from polyturn.rollout.workers import WorkerPool
from polyturn.train.host import TrainerHost
from polyturn.train.setup import make_envs, vllm_settings


def check_workers(cfg: TrainConfig, *, world_size: int = 1) -> None:
    """Rollout workers feed one learner: refuse them under torchrun (``world_size`` processes)."""
    if world_size > 1 and cfg.rollout.workers:
        raise ValueError(f"Expected one process per run with rollout.workers > 0 (one learner), got --nproc "
                         f"{world_size}: use rollout.workers=0 with --nproc, or train in one process")


def split_stale(episodes: Sequence[Episode], tasks: Sequence[dict], *, version: int, max_staleness: int,
                partial: Literal["finish", "drop"]) -> tuple[list[Episode], list[dict]]:
    """The episodes an update at ``version`` may train on, and the tasks of the others (to be played again).

    An episode goes back when one of its turns is more than ``max_staleness`` versions old, or, with
    ``partial = "drop"``, when its turns were written by more than one version (it spanned an update).
    """
    keep: list[Episode] = []
    again: list[dict] = []
    for ep, task in zip(episodes, tasks, strict=True):
        versions = {t.version for t in ep.turns}
        too_old = any(version - v > max_staleness for v in versions)
        if too_old or (partial == "drop" and len(versions) > 1):
            again.append(task)
        else:
            keep.append(ep)
    return keep, again


class RemoteCollection:
    """Sends each RL iteration's tasks to a :class:`WorkerPool` and returns its episodes with their metrics."""

    def __init__(self, trainer: TrainerHost) -> None:
        cfg = trainer.cfg
        self.trainer = trainer
        r = cfg.rollout
        self.k = r.max_staleness if r.async_ else 0
        self.batch = cfg.ppo.episodes_per_iter
        self.pool = WorkerPool(
            actor=trainer.actor, make_envs=functools.partial(make_envs, cfg), num_envs=r.num_envs,
            num_workers=r.workers, env_id=cfg.env.id, settings=trainer.settings, env_threads=r.env_threads,
            threads=cfg.run.rollout_threads, device=cfg.run.device, precision=cfg.run.precision,
            gpus=r.worker_gpus, address=cfg.run.ray_address, version=trainer.state.iter,
            vllm=vllm_settings(cfg) if r.engine == "vllm" else None, vllm_dir=trainer.out / "vllm",
        )
        # The learner's weights as they are now (after BC, or resumed), as version = iterations done: the workers
        # tag their turns with the version of the last broadcast (test: a resumed run's turns are 0 versions old).
        self.pool.broadcast(trainer.actor, version=trainer.state.iter)
        self._sent: dict[int, tuple[int, list[dict]]] = {}  # iteration -> (ticket, tasks)
        self._last = time.perf_counter()

    def _submit(self, tasks: list[dict], it: int) -> int:
        """Send ``tasks`` with iteration ``it``'s temperature and epsilon and a fresh seed; the ticket."""
        tr = self.trainer
        cur = tr.cfg.curriculum
        progress = it / max(1, tr.rl_total)
        seed = int(tr.rng.integers(2**31))
        return self.pool.submit(tasks, temperature=cur.temperature.at(progress), epsilon=cur.epsilon.at(progress),
                                seed=seed)

    def _send(self, it: int) -> None:
        tasks = self.trainer.next_tasks(self.batch, it / max(1, self.trainer.rl_total))
        self._sent[it] = (self._submit(tasks, it), tasks)

    def capacity(self) -> int:
        """Episodes that may still be sent: ``(k + version + 1) * B - (accepted + running)``."""
        version = self.pool.version
        accepted = version * self.batch  # one batch trained on per version
        running = sum(len(tasks) for _, tasks in self._sent.values())
        return (self.k + version + 1) * self.batch - (accepted + running)

    def episodes(self, it: int) -> tuple[list[Episode], dict[str, float]]:
        """Iteration ``it``'s episodes (gathered from the workers) and the collection's metrics."""
        nxt = max(self._sent, default=it - 1) + 1
        while nxt < self.trainer.rl_total and self.capacity() >= self.batch:
            self._send(nxt)
            nxt += 1
        ticket, tasks = self._sent.pop(it)
        eps = self.pool.gather(ticket)
        version = self.pool.version
        keep, again = split_stale(eps, tasks, version=version, max_staleness=self.k,
                                  partial=self.trainer.cfg.rollout.partial)
        dropped = len(again)
        if again:  # played again by the current version (staleness 0)
            keep += self.pool.gather(self._submit(again, it))
        st = self.pool.take_stats()
        now = time.perf_counter()
        wall, self._last = now - self._last, now
        lags = [version - t.version for ep in keep for t in ep.turns]
        metrics = {
            "async/staleness_mean": sum(lags) / max(1, len(lags)),
            "async/staleness_max": float(max(lags, default=0)),
            "async/dropped": float(dropped),
            "perf/learner_idle_s": st.wait_s,
            "perf/learner_idle_share": st.wait_s / wall if wall > 0 else 0.0,
            "perf/worker_idle_share": st.idle_s / max(1e-9, st.idle_s + st.busy_s),
            "workers/restarts": float(st.restarts),
        }
        return keep, metrics

    def after_update(self) -> None:
        """Send the learner's new weights to every worker (installed mid-collection in async runs)."""
        self.pool.broadcast(self.trainer.actor)

    def close(self) -> None:
        self.pool.close()

