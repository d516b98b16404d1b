"""Rollout workers as Ray actors: each holds its share of the environments, a copy of the actor and a Collector.

The learner drives them through a :class:`WorkerPool` (as verl's ``AgentLoopWorker`` s and SkyRL's
generators are driven): a batch of tasks is cut into chunks, chunk ``j`` goes to worker ``j % N``
and is played there by the same :class:`~polyturn.rollout.collector.Collector` the in-process path
uses, so episodes come back token-in/token-out exactly as it returns them (ids, behaviour log-probs,
the policy version of each turn, the environment's info).

* Weights go out through Ray's object store (one ``ray.put`` per update, read by every worker), tagged
  with a policy version; only trainable parameters travel, so a LoRA actor sends its adapters alone.
* A worker runs its collect calls one at a time, in the order they were sent (Ray's default
  concurrency group); weight updates and probes run in a second group, so an update that arrives
  mid-collection is installed between two decoding rounds and the turns after it carry the new version.
* A worker that dies (its process killed, its node lost) is started again with the current weights and
  its unfinished chunks are sent again: a chunk's episodes are kept only when the whole chunk returns,
  so nothing is lost or counted twice, and a chunk replayed with the same weights gives the same episodes
  (its seed is its own, not the worker's).
* With ``vllm`` settings (``rollout.engine: vllm``) each worker fronts a vLLM server of its own (under
  ``<vllm_dir>/worker<i>``, :class:`~polyturn.rollout.vllm_engine.VLLMEngine`) that samples its collections;
  weights reach the worker's actor as usual and the server at the start of the worker's next collection (not
  mid-collection: the server would still sample with the old ones while the turns said the new version). A
  worker's server dies with it (the server's parent-death signal) and a restarted worker starts a new one.

Ray is an optional dependency (``pip install 'polyturn[ray]'``); nothing here imports it at module load.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polyturn.models.actor import Actor
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.types import Episode
from polyturn.rollout.vllm_engine import VLLMEngine
from polyturn.runtime import Runtime

__all__ = ["RolloutWorker", "WorkerPool", "trainable_weights"]


def trainable_weights(actor: Actor) -> dict[str, torch.Tensor]:
    """What a broadcast sends: the actor's trainable parameters on CPU (a LoRA actor's adapter weights only)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in actor.model.named_parameters() if p.requires_grad}


class RolloutWorker:
    """The body of one Ray actor: environments, a copy of the actor, a :class:`Collector`."""

    def __init__(self, *, actor: Actor, make_envs: Callable[[], list], env_id: str, settings: RolloutSettings,
                 env_threads: int, threads: int, device: str, precision: str,
                 vllm: dict[str, Any] | None = None) -> None:
        torch.set_num_threads(threads)
        self.actor = actor.to(Runtime.from_config(device, precision))
        self.actor.model.eval()
        self.engine: VLLMEngine | None = None
        if vllm is not None:  # {"workdir": ..., and VLLMEngine's keyword arguments}
            kw = dict(vllm)
            self.engine = VLLMEngine(self.actor, kw.pop("workdir"), **kw).start()
        self.collector = Collector(self.actor, make_envs(), env_id=env_id, settings=settings, env_threads=env_threads,
                                   vllm=self.engine)
        if self.engine is None:  # vLLM gets new weights when a collection starts, never mid-way
            self.collector.on_round = self._install_pending
        self._lock = threading.Lock()
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._busy = False
        self._last_end = time.perf_counter()

    def pid(self) -> int:
        """The worker's process id (the fault tests kill it)."""
        return os.getpid()

    def collecting(self) -> bool:
        """Whether a collect call is running now."""
        return self._busy

    def version(self) -> int:
        """The policy version of the weights installed now."""
        return self.collector.version

    def close(self) -> None:
        """Stop the worker's vLLM server, if it has one."""
        if self.engine is not None:
            self.engine.close()

    def weights(self) -> dict[str, torch.Tensor]:
        """The worker's trainable weights, as :func:`trainable_weights` reads the learner's."""
        return trainable_weights(self.actor)

    def set_weights(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        """Install ``weights`` as policy ``version`` now, or at the next decoding round when collecting."""
        with self._lock:
            self._pending = (version, weights)
            if not self._busy:
                self._install_locked()
        return version

    def _install_locked(self) -> None:
        if self._pending is None:
            return
        version, weights = self._pending
        self._pending = None
        missing = set(weights) - set(dict(self.actor.model.named_parameters()))
        if missing:
            raise ValueError(f"Expected the learner's parameter names, got unknown ones: {sorted(missing)[:3]}")
        self.actor.model.load_state_dict(weights, strict=False)
        self.collector.version = version

    def _install_pending(self) -> None:
        with self._lock:
            self._install_locked()

    def collect(self, tasks: Sequence[dict], *, temperature: float, epsilon: float,
                seed: int) -> tuple[list[Episode], dict[str, float]]:
        """Play ``tasks`` with the collector; returns the episodes (task order) and this call's timings."""
        t0 = time.perf_counter()
        with self._lock:
            self._busy = True
            self._install_locked()
        try:
            eps = self.collector.collect(tasks, temperature=temperature, epsilon=epsilon,
                                         rng=np.random.default_rng(seed),
                                         generator=self.actor.runtime.generator(seed))
        finally:
            with self._lock:
                self._busy = False
        end = time.perf_counter()
        idle, self._last_end = t0 - self._last_end, end
        return eps, {"busy_s": end - t0, "idle_s": idle}


#: A worker that dies this many times in a row without returning a chunk stops the run with its error (one that
#: cannot start again, e.g. its vLLM server fails, would otherwise be restarted forever).
MAX_DEATHS = 3


@dataclass
class _Chunk:
    """A slice of one submitted batch, played by worker ``worker`` as one collect call."""

    ticket: int
    index: int
    worker: int
    tasks: list[dict]
    kwargs: dict[str, Any]
    result: list[Episode] | None = None


@dataclass
class PoolStats:
    """What the pool measured since the last :meth:`WorkerPool.take_stats`."""

    busy_s: float = 0.0
    idle_s: float = 0.0
    restarts: int = 0
    wait_s: float = 0.0


class WorkerPool:
    """N rollout workers on Ray, driven by the learner: submit batches, gather them, broadcast weights."""

    def __init__(self, *, actor: Actor, make_envs: Callable[[int], list], num_envs: int, num_workers: int,
                 env_id: str, settings: RolloutSettings, env_threads: int = 1, threads: int = 1,
                 device: str = "cpu", precision: str = "fp32", gpus: float = 0.0, address: str | None = None,
                 version: int = 0, vllm: dict[str, Any] | None = None, vllm_dir: str | os.PathLike | None = None,
                 max_deaths: int = MAX_DEATHS) -> None:
        """``vllm``: :class:`VLLMEngine`'s keyword arguments (less the directory) for a server per worker, under
        ``vllm_dir/worker<i>``; None: the workers sample with the home engine. Returns once every worker is up
        (a worker that cannot start is a ``RuntimeError`` with its error); ``max_deaths``: see :data:`MAX_DEATHS`."""
        try:
            import ray
        except ImportError:  # a ValueError: the CLI reports it as the user's one-line error
            raise ValueError("Expected Ray for rollout.workers > 0, got none installed: pip install 'polyturn[ray]' "
                             "(or set rollout.workers=0 to collect in the training process)") from None
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f"Expected 1 <= workers <= num_envs, got workers = {num_workers}, num_envs = {num_envs}")
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        if actor.device.type != "cpu":
            actor = copy.deepcopy(actor)
            actor.model.to("cpu")
        self._actor_ref = ray.put(actor)
        self.sizes = [num_envs // num_workers + (i < num_envs % num_workers) for i in range(num_workers)]
        self._spec = dict(env_id=env_id, settings=settings, env_threads=env_threads, threads=threads,
                          device=device, precision=precision)
        self._make_envs = make_envs
        if vllm is not None:
            if vllm_dir is None:
                raise ValueError("Expected vllm_dir with vllm settings (each worker's server keeps its files there)")
            # Absolute paths: a worker's process need not start where the learner did. (abspath, not resolve: the
            # venv's python is a link that must stay one.)
            vllm = {**vllm, "python": os.path.abspath(vllm.get("python", ".venv-vllm/bin/python"))}
            if not Path(vllm["python"]).is_file():
                raise ValueError(f"Expected vLLM's virtual environment at {vllm['python']} (rollout.vllm_python), "
                                 "found none; run `make vllm-venv` to install it (docs/vllm.md)")
            vllm_dir = os.path.abspath(vllm_dir)
        self._vllm, self._vllm_dir = vllm, vllm_dir
        self._cls = ray.remote(concurrency_groups={"control": 1})(RolloutWorker).options(
            num_cpus=threads, num_gpus=gpus, max_restarts=0)
        self.version = version
        self._weights_ref: Any = None
        self.workers = [self._start(i) for i in range(num_workers)]
        self._chunks: dict[tuple[int, int], _Chunk] = {}
        self._inflight: dict[Any, tuple[int, int]] = {}
        self._deaths: dict[int, int] = {}  # worker -> deaths since it last returned a chunk
        self._max_deaths = max_deaths
        try:  # up, servers and all, before the first batch is sent
            ray.get([self._control(w, "pid") for w in self.workers])
        except ray.exceptions.RayActorError as exc:
            self.close()
            raise RuntimeError(f"A rollout worker could not start: {str(exc).strip()[-2000:]}") from None
        self._tickets = 0
        self.stats = PoolStats()

    # ---- workers -----------------------------------------------------------------
    def _start(self, i: int) -> Any:
        import functools

        vllm = None if self._vllm is None else {**self._vllm, "workdir": str(Path(self._vllm_dir) / f"worker{i}")}
        w = self._cls.remote(actor=self._actor_ref, make_envs=functools.partial(self._make_envs, self.sizes[i]),
                             vllm=vllm, **self._spec)
        if self._weights_ref is not None:
            self._control(w, "set_weights", self.version, self._weights_ref)
        return w

    def _control(self, worker: Any, method: str, *args: Any) -> Any:
        return getattr(worker, method).options(concurrency_group="control").remote(*args)

    def call(self, i: int, method: str, *args: Any) -> Any:
        """Worker ``i``'s ``method`` (pid, collecting, version, weights, set_weights), answered while it collects."""
        return self._ray.get(self._control(self.workers[i], method, *args))

    def broadcast(self, actor: Actor, *, version: int | None = None, wait: bool = True) -> int:
        """Send the actor's trainable weights to every worker as policy ``version`` (default: the next one)."""
        self.version = self.version + 1 if version is None else version
        self._weights_ref = self._ray.put(trainable_weights(actor))
        refs = [self._control(w, "set_weights", self.version, self._weights_ref) for w in self.workers]
        if wait:
            try:
                self._ray.get(refs)
            except self._ray.exceptions.RayActorError:
                pass  # a dead worker is restarted with these weights when its chunks are gathered
        return self.version

    # ---- batches -----------------------------------------------------------------
    def submit(self, tasks: Sequence[dict], *, temperature: float, epsilon: float, seed: int) -> int:
        """Queue ``tasks`` on the workers (chunk ``j`` on worker ``j % N``); returns a ticket for :meth:`gather`."""
        ticket = self._tickets
        self._tickets += 1
        size = max(1, min(self.sizes))
        for j, s in enumerate(range(0, len(tasks), size)):
            ch = _Chunk(ticket=ticket, index=j, worker=j % len(self.workers), tasks=list(tasks[s : s + size]),
                        kwargs={"temperature": temperature, "epsilon": epsilon, "seed": seed + j})
            self._chunks[(ticket, j)] = ch
            self._send(ch)
        return ticket

    def _send(self, ch: _Chunk) -> None:
        ref = self.workers[ch.worker].collect.remote(ch.tasks, **ch.kwargs)
        self._inflight[ref] = (ch.ticket, ch.index)

    def gather(self, ticket: int) -> list[Episode]:
        """Block until every chunk of ``ticket`` is back; its episodes in task order (dead workers restarted)."""
        t0 = time.perf_counter()
        keys = sorted(k for k in self._chunks if k[0] == ticket)
        if not keys:
            raise KeyError(f"Expected a ticket from submit() not yet gathered, got {ticket}")
        while any(self._chunks[k].result is None for k in keys):
            ready, _ = self._ray.wait(list(self._inflight), num_returns=1)
            for ref in ready:
                self._receive(ref)
        self.stats.wait_s += time.perf_counter() - t0
        out: list[Episode] = []
        for k in keys:
            out += self._chunks.pop(k).result or []
        return out

    def _receive(self, ref: Any) -> None:
        key = self._inflight.pop(ref)
        i = self._chunks[key].worker
        try:
            eps, timing = self._ray.get(ref)
        except self._ray.exceptions.RayActorError as exc:
            self._deaths[i] = self._deaths.get(i, 0) + 1
            if self._deaths[i] >= self._max_deaths:  # it dies on every chunk, or cannot start again: stop
                raise RuntimeError(f"Rollout worker {i} died {self._deaths[i]} times in a row without finishing a "
                                   f"chunk; the last time: {str(exc).strip()[-2000:]}") from None
            self._restart(i)
            return
        self._deaths[i] = 0
        self._chunks[key].result = eps
        self.stats.busy_s += timing["busy_s"]
        self.stats.idle_s += timing["idle_s"]

    def _restart(self, i: int) -> None:
        """Start worker ``i`` again (current weights) and send it every chunk of its not yet returned."""
        dead = self.workers[i]
        # Its other calls fail too: drop their refs, the chunks are sent again below.
        self._inflight = {r: k for r, k in self._inflight.items() if self._chunks[k].worker != i}
        self._ray.kill(dead, no_restart=True)
        self.workers[i] = self._start(i)
        self.stats.restarts += 1
        for k in sorted(self._chunks):
            if self._chunks[k].worker == i and self._chunks[k].result is None:
                self._send(self._chunks[k])

    def take_stats(self) -> PoolStats:
        """The stats since the last call (and start counting again)."""
        out, self.stats = self.stats, PoolStats()
        return out

    def close(self) -> None:
        """Stop the workers and their vLLM servers (the Ray instance stays up for whoever started it)."""
        if self._vllm is not None:
            try:
                self._ray.get([self._control(w, "close") for w in self.workers], timeout=60)
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
                pass  # a dead worker's server died with it
        for w in self.workers:
            self._ray.kill(w, no_restart=True)
        self.workers = []
