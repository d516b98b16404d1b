"""``polyturn serve --engine vllm``: :class:`~polyturn.serve.engine.Engine`'s interface over a vLLM server.

Only the decoding moves: the service, sessions, environment sessions, the OpenAI-compatible API, A/B routing
and rollback, recording and metrics call :class:`VLLMServeEngine` exactly as they call the home engine
(``open_slot``, ``submit``, ``release``, ``stats``, ``start``, ``stop``).

The checkpoint's weights are hosted by the rollout engine's :class:`~polyturn.rollout.vllm_engine.VLLMEngine`
(a full actor's weights copied under a temporary directory, or a LoRA actor's base model with its adapters
loaded), a vLLM server in its own virtual environment (``make vllm-venv``). Each session's context is kept here
as token ids; a turn sends the whole context as one completions request (prompt ids in, sampled ids and their
log-probs out: :meth:`~polyturn.rollout.vllm_decoder.VLLMDecoder.sample_one`) from a thread of a pool, one
thread per live turn. vLLM batches the concurrent requests itself (continuous batching) and its prefix cache
makes a session's history, sent again each turn, cost only its new tokens, so the home engine's cache rows,
chunked prefill and batch window have nothing to do here.

A server that dies is started again by the thread of the first turn that finds it dead (that turn, and any
sent while it restarts, fail: their sessions start their context over at the next turn), at most
:data:`MAX_RESTARTS` times; after that its turns keep failing, which the ramp's error guard counts.

A turn's ``seed`` is vLLM's per-request seed: the same context, temperature and seed give the same tokens
again. The recorded log-probs are vLLM's, after temperature (``--logprobs-mode processed_logprobs``), the
distribution the trainer and off-policy evaluation score.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from polyturn.models.actor import Actor
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.vllm_decoder import VLLMDecoder
from polyturn.rollout.vllm_engine import VLLMEngine
from polyturn.serve.engine import EngineFull, Slot, TurnRequest, TurnResult

log = logging.getLogger(__name__)

#: The most times a version's dead vLLM server is started again.
MAX_RESTARTS = 3


class VLLMServeEngine:
    """Serves one checkpoint version through a vLLM server (see the module docstring).

    Args:
        actor: the loaded actor, whose weights the server hosts (the service keeps it for tokenizing).
        settings: the checkpoint's rollout settings (the server's context length: budget plus an action).
        version: the version's name, as routed and recorded.
        max_rows: most concurrent sessions (and turns in flight).
        python: the interpreter of vLLM's virtual environment.
        precision: the dtype vLLM computes in (``fp32``, ``bf16``, ``fp16``).
        threads: the server's torch threads.
        on_step: called after each turn with (turns in flight, the turn's request's seconds per sampled token),
            which the metrics record as a decode step's rows and seconds.
    """

    reports_top_logprobs = False  # not asked of vLLM yet

    def __init__(self, actor: Actor, *, settings: RolloutSettings, version: str, max_rows: int = 64,
                 python: str | Path = ".venv-vllm/bin/python", precision: str = "fp32", threads: int = 1,
                 on_step: Callable[[int, float], None] | None = None) -> None:
        if max_rows < 1:
            raise ValueError(f"Expected max_rows >= 1, got {max_rows}")
        self.actor = actor
        self.settings = settings
        self.version = version
        self.max_rows = max_rows
        self.on_step = on_step
        self.workdir = Path(tempfile.mkdtemp(prefix="polyturn-vllm-serve-"))
        try:
            self.vllm = VLLMEngine(actor, self.workdir, python=python, precision=precision, threads=threads,
                                   max_model_len=settings.context_budget + settings.max_action_tokens + 16)
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.dec = VLLMDecoder(self.vllm.server, pad_id=actor.pad_id, stop_id=actor.stop_id)
        self._pool = ThreadPoolExecutor(max_rows, thread_name_prefix=f"vllm-{version}")
        self._lock = threading.Lock()
        self._hist: dict[Slot, list[int]] = {}  # per leased slot: the context vLLM saw and the ids it sampled
        self._busy: set[Slot] = set()
        self._stopped = False
        self._restarting = threading.Lock()
        self.leased = 0
        self.steps = 0
        self.tokens = 0

    # ----- the home engine's interface ------------------------------------------------------------
    def start(self) -> VLLMServeEngine:
        """Start the vLLM server (tens of seconds on a CPU) and load a LoRA actor's adapters into it."""
        try:
            self.vllm.start()
            self.vllm.sync(self.actor)  # a LoRA actor's adapters (a full actor's weights are there already)
        except BaseException:
            self.stop()
            raise
        log.info("version %s: vLLM server on %s started in %.1f s (log: %s)", self.version,
                 self.vllm.server.base_url, self.vllm.server.startup_s, self.vllm.server.log_path)
        return self

    def stop(self) -> None:
        """Stop the server; turns in flight fail (their requests find no server), later submits raise."""
        with self._lock:
            self._stopped = True
        self.vllm.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def open_slot(self) -> Slot:
        """Lease a session's place; :class:`EngineFull` when ``max_rows`` are leased."""
        with self._lock:
            if self.leased >= self.max_rows:
                raise EngineFull(f"Expected a free session place, got all {self.max_rows} leased; close idle "
                                 "sessions or start the server with a larger --max-sessions")
            self.leased += 1
        return Slot()

    def release(self, slot: Slot) -> None:
        """End a lease and forget the session's tokens (vLLM's prefix cache forgets them in its own time)."""
        with self._lock:
            if slot.closed:
                return
            slot.closed = True
            self.leased -= 1
            self._hist.pop(slot, None)

    def submit(self, req: TurnRequest) -> Future:
        """Queue a turn; the future resolves to a :class:`TurnResult`. ``req.context`` extends the session's
        tokens (or, with ``restart`` or on its first turn, is all of them)."""
        if req.slot.closed:
            raise ValueError("Expected an open slot, got a released one")
        if req.restart and not req.context:
            raise ValueError("Expected a non-empty context for a restarted row, got an empty one")
        if req.explore:
            raise ValueError("Expected no exploration with --engine vllm (its candidates are the home engine's)")
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"Engine {self.version} is stopped")
            if req.slot in self._busy:
                req.future.set_exception(ValueError("Expected one turn at a time per session, got a second one"))
                return req.future
            if req.restart or req.slot not in self._hist:
                self._hist[req.slot] = []
            self._hist[req.slot] += req.context
            ids = list(self._hist[req.slot])
            self._busy.add(req.slot)
        self._pool.submit(self._serve, req, ids)
        return req.future

    def stats(self) -> dict[str, int]:
        """Leased sessions, turns in flight, turns and tokens so far (``rows``: the leases, as there are no rows)."""
        with self._lock:
            return {"rows": self.leased, "leased": self.leased, "running": len(self._busy), "steps": self.steps,
                    "tokens": self.tokens}

    @property
    def restarts(self) -> int:
        """How many times the server was started again after it died."""
        return self.vllm.restarts

    def _restart_if_dead(self) -> None:
        """Start the server again if it died (not if it refused a request, or was stopped); one thread at a time."""
        proc = self.vllm.server.proc
        if proc is None or proc.poll() is None or not self._restarting.acquire(blocking=False):
            return  # stopped, alive (the request was refused), or another turn's thread is restarting it
        try:
            with self._lock:
                if self._stopped:
                    return
            if self.vllm.restarts >= MAX_RESTARTS:
                log.error("engine %s: the vLLM server died again after %d restarts; not restarting it (its log: %s)",
                          self.version, self.vllm.restarts, self.vllm.server.log_path)
                return
            self.vllm.restart()  # logs why, keeps the dead server's log as server.log.1
            self.vllm.sync(self.actor)  # a LoRA actor's adapters, loaded again
            log.info("engine %s: vLLM server started again in %.1f s", self.version, self.vllm.server.startup_s)
        except Exception as exc:  # noqa: BLE001 - the next turn that finds it dead tries again
            log.error("engine %s: starting the vLLM server again failed: %s", self.version, exc)
        finally:
            self._restarting.release()

    # ----- a pool thread ------------------------------------------------------------------------------
    def _serve(self, req: TurnRequest, ids: list[int]) -> None:
        """Sample one turn (a request to the server) and resolve its future; a failed request fails the turn."""
        req.started = time.perf_counter()
        try:
            act = self.dec.sample_one(ids, temperature=req.temperature, top_p=req.top_p,
                                      max_new_tokens=req.max_new_tokens, seed=req.seed, on_token=req.on_token)
        except BaseException as exc:  # the session's next turn starts its context over (the service invalidates)
            with self._lock:
                self._busy.discard(req.slot)
                self._hist.pop(req.slot, None)
            if not req.slot.closed:
                log.warning("engine %s: a turn failed: %s", self.version, exc)
            req.future.set_exception(exc)
            self._restart_if_dead()
            return
        now = time.perf_counter()
        with self._lock:
            self._busy.discard(req.slot)
            if req.slot in self._hist:
                self._hist[req.slot] += act.ids
            self.steps += 1
            self.tokens += len(act.ids)
            running = len(self._busy) + 1
        if self.on_step is not None:
            self.on_step(running, (now - req.started) / max(1, len(act.ids)))
        req.future.set_result(TurnResult(ids=act.ids, logprobs=act.logprobs, hit_cap=act.hit_cap, forced=False,
                                         queue_s=req.started - req.submitted, decode_s=now - req.started,
                                         explored=None))
