"""One served model version: a background thread that batches every live session's turn.

The engine drives :class:`polyturn.rollout.generate.BatchDecoder` — the decoder
the rollouts use — one token at a time (``sample(max_new_tokens=1)`` then
``append``), so it batches at token granularity: a request that arrives while
others are mid-action joins the batch at the next token instead of waiting for
the batch to finish (continuous batching, as vLLM does). Each live session
leases one cache row (:class:`Slot`) and keeps it across its turns, so a turn
prefills only its new tokens.

Rows are reused (``restart_row``: the new session's tokens overwrite the row's
columns from 0, so ended sessions leave no dead columns); the batch grows
(doubling, up to ``max_rows``) when more sessions are live than rows, and is
then re-prefilled from each row's token history.

Chunked prefill (``prefill_chunk``, as vLLM and SGLang schedule it): a turn's new context (a tool result of
hundreds of tokens) is fed at most ``prefill_chunk`` tokens per loop, each chunk in the same forward pass as
the other rows' next decode token, so one long observation delays the sessions decoding beside it by a chunk
per step instead of by all of it. A fresh row's shared system-prompt prefix is copied, not computed, so it does
not count against the chunk.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from polyturn.models.actor import Actor
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.generate import BatchDecoder
from polyturn.serve.explore import ExploreSettings, pick_candidate

log = logging.getLogger(__name__)


class EngineFull(RuntimeError):
    """Every cache row is leased; the caller should answer 503 (or close idle sessions)."""


@dataclass(eq=False)
class Slot:
    """A lease on one cache row, held by a session across its turns."""

    row: int | None = None
    closed: bool = False


@dataclass(eq=False)
class TurnRequest:
    """One action to sample for a slot.

    ``context`` are forced tokens appended first (the prompt, or the next
    observation); with ``restart`` the row forgets everything and ``context``
    is its whole context (a new conversation or a rebuilt one). ``seed`` is
    honoured by ``--engine vllm`` (vLLM's per-request seed); this engine draws
    every row of a batch from one generator and ignores it. ``top_logprobs`` > 0
    also reports, for each sampled token, that many most likely tokens and their
    log-probs (the sampled distribution's; at temperature 0, temperature 1's).
    """

    slot: Slot
    context: list[int]
    restart: bool
    temperature: float
    max_new_tokens: int
    top_p: float = 1.0
    explore: bool = False
    seed: int | None = None
    on_token: Callable[[int], None] | None = None
    top_logprobs: int = 0
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    submitted: float = field(default_factory=time.perf_counter)
    # worker state
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    forced: list[int] | None = None
    explored: dict | None = None
    started: float = 0.0


@dataclass
class TurnResult:
    """The sampled action and how it was served."""

    ids: list[int]
    logprobs: list[float]
    hit_cap: bool
    forced: bool
    queue_s: float
    decode_s: float
    explored: dict | None
    #: Set by the service: the tokens appended to the row before this action, whether the row started over with
    #: them, the sampling temperature and seed (recorded, so off-policy evaluation re-scores on the exact context).
    context: list[int] = field(default_factory=list)
    restart: bool = False
    temperature: float = 0.0
    seed: int | None = None
    #: With ``TurnRequest.top_logprobs``: each sampled token's most likely alternatives, ``(id, logprob)``.
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


class Engine:
    """Serves one checkpoint version (see the module docstring).

    ``reports_top_logprobs``: whether it answers :attr:`TurnRequest.top_logprobs` (the unbatched and vLLM engines
    do not).

    Args:
        actor: the loaded actor (put in eval mode here).
        settings: the checkpoint's rollout settings (token cap, context budget).
        version: the version's name, as routed and recorded.
        max_rows: most concurrent sessions (cache rows).
        prefill_chunk: most context tokens a row feeds per loop (see the module docstring); 0: all at once.
        batch_window_s: when idle, how long to wait for more requests before the first step.
        explore: exploration settings (off unless ``epsilon > 0`` is asked for per request).
        on_step: called after each decode step with (rows decoding, seconds).
    """

    reports_top_logprobs = True

    def __init__(
        self,
        actor: Actor,
        *,
        settings: RolloutSettings,
        version: str,
        max_rows: int = 64,
        batch_window_s: float = 0.002,
        explore: ExploreSettings | None = None,
        seed: int = 0,
        on_step: Callable[[int, float], None] | None = None,
        prefill_chunk: int = 64,
    ) -> None:
        if max_rows < 1:
            raise ValueError(f"Expected max_rows >= 1, got {max_rows}")
        if prefill_chunk < 0:
            raise ValueError(f"Expected prefill_chunk >= 0 (0: a turn's context in one pass), got {prefill_chunk}")
        self.actor = actor
        self.actor.model.eval()
        self.settings = settings
        self.version = version
        self.max_rows = max_rows
        self.batch_window_s = batch_window_s
        self.explore = explore or ExploreSettings()
        self.on_step = on_step
        self.prefill_chunk = prefill_chunk
        self.generator = torch.Generator(device=actor.device).manual_seed(seed)  # sampling draws on the actor's device
        self.dec = BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id, autocast=actor.autocast,
                                capacity=settings.context_budget)
        self.rows = 0
        self._dec_rows = 0  # rows the decoder holds (as of its last reset)
        self.hist: list[list[int]] = []  # per row: every token given to the decoder (fed or pending)
        self._ctx: list[list[int]] = []  # per row: context admitted but not yet fed (chunked prefill)
        self.owner: list[Slot | None] = []
        self.leased = 0
        self._queue: list[TurnRequest] = []
        self._released: list[Slot] = []
        self._running: dict[int, TurnRequest] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name=f"engine-{version}", daemon=True)
        self.steps = 0
        self.tokens = 0

    # ----- public API (any thread) -------------------------------------------------------------
    def start(self) -> Engine:
        """Start the worker thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the worker; queued requests fail with ``RuntimeError``."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def open_slot(self) -> Slot:
        """Lease a row for a new session; :class:`EngineFull` when ``max_rows`` are leased."""
        with self._cond:
            if self.leased >= self.max_rows:
                raise EngineFull(f"Expected a free cache row, got all {self.max_rows} leased; close idle sessions "
                                 "or start the server with a larger --max-sessions")
            self.leased += 1
        return Slot()

    def release(self, slot: Slot) -> None:
        """End a lease; the row is restarted and reused."""
        with self._cond:
            if slot.closed:
                return
            slot.closed = True
            self.leased -= 1
            self._released.append(slot)
            self._cond.notify_all()

    def submit(self, req: TurnRequest) -> concurrent.futures.Future:
        """Queue a turn; the future resolves to a :class:`TurnResult`."""
        if req.slot.closed:
            raise ValueError("Expected an open slot, got a released one")
        if req.restart and not req.context:
            raise ValueError("Expected a non-empty context for a restarted row, got an empty one")
        with self._cond:
            if self._stop:
                raise RuntimeError(f"Engine {self.version} is stopped")
            self._queue.append(req)
            self._cond.notify_all()
        return req.future

    def stats(self) -> dict[str, int]:
        """Rows, leased rows, running requests, steps and tokens so far."""
        return {"rows": self.rows, "leased": self.leased, "running": len(self._running),
                "steps": self.steps, "tokens": self.tokens}

    # ----- worker ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._queue or self._released or self._running):
                    self._cond.wait(timeout=0.5)
                if self._stop:
                    break
                idle = not self._running
            if idle and self.batch_window_s > 0:
                time.sleep(self.batch_window_s)  # let concurrent requests arrive and share the first step
            with self._cond:
                new, self._queue = self._queue, []
                released, self._released = self._released, []
            try:
                self._admit(new, released)
                self._prefill()
                if self._running:
                    self._step()
            except Exception as exc:  # a failed forward fails its requests, never the thread
                log.exception("engine %s step failed", self.version)
                for req in list(self._running.values()) + [r for r in new if not r.future.done()]:
                    if not req.future.done():
                        req.future.set_exception(exc)
                self._running.clear()
                self._rebuild()
        with self._cond:
            pending = self._queue + list(self._running.values())
        for req in pending:
            if not req.future.done():
                req.future.set_exception(RuntimeError(f"Engine {self.version} stopped"))

    def _free_row(self) -> int:
        for r in range(self.rows):
            if self.owner[r] is None:
                return r
        return -1

    def _admit(self, new: list[TurnRequest], released: list[Slot]) -> None:
        for slot in released:
            if slot.row is not None:
                r = slot.row
                self.owner[r] = None
                self.hist[r] = []
                self._ctx[r] = []
                req = self._running.pop(r, None)
                if req is not None and not req.future.done():
                    req.future.set_exception(RuntimeError("Expected the session to stay open during its turn, "
                                                          "got it closed"))
                if r < self._dec_rows:
                    self.dec.restart_row(r)
        rebuild = False
        for req in new:
            if req.slot.closed:
                req.future.set_exception(ValueError("Expected an open session, got a closed one"))
                continue
            if req.slot.row is None:
                r = self._free_row()
                if r < 0:  # grow the batch (leases are capped, so this stays within max_rows)
                    r = self.rows
                    grow = max(1, min(self.max_rows, 2 * self.rows) - self.rows)
                    self.rows += grow
                    self.hist += [[] for _ in range(grow)]
                    self._ctx += [[] for _ in range(grow)]
                    self.owner += [None] * grow
                    rebuild = True
                self.owner[r] = req.slot
                req.slot.row = r
                req.restart = True
            r = req.slot.row
            if r in self._running:
                req.future.set_exception(ValueError("Expected one turn at a time per session, got a second one"))
                continue
            if req.restart:
                self.hist[r] = []
                self._ctx[r] = []
                if not rebuild and r < self._dec_rows:
                    self.dec.restart_row(r)
            self.hist[r] += req.context
            self._ctx[r] += req.context
            if req.explore and self.explore.candidates > 0:
                req.forced, req.explored = pick_candidate(
                    self.actor, self.hist[r], self.explore, max_new_tokens=req.max_new_tokens, generator=self.generator
                )
            req.started = time.perf_counter()
            self._running[r] = req
        if rebuild or self._dec_rows != self.rows:
            self._rebuild()

    def _prefill(self) -> None:
        """Feed each row's next chunk of admitted context (every row's, in one forward pass)."""
        if not any(self._ctx):
            return
        prefix = self.dec.shared_prefix
        pieces = []
        for r, ctx in enumerate(self._ctx):
            n = len(ctx) if self.prefill_chunk == 0 else self.prefill_chunk
            if prefix and self.dec.lengths[r] == 0 and ctx[: len(prefix)] == prefix:
                n += len(prefix)  # a fresh row copies the shared prefix's keys and values: not computed
            pieces.append(ctx[:n])
            self._ctx[r] = ctx[n:]
        self.dec.append(pieces)

    def _rebuild(self) -> None:
        """Re-prefill every row from its history (the batch grew); nothing is left to feed in chunks."""
        self._ctx = [[] for _ in range(self.rows)]
        if self.rows == 0:
            return
        self.dec.reset([h if h else [self.actor.pad_id] for h in self.hist])
        self._dec_rows = self.rows
        for r, h in enumerate(self.hist):
            if not h:
                self.dec.restart_row(r)

    def _step(self) -> None:
        """One token for every running request whose context is all fed; finished ones resolve their futures."""
        ready = [r for r in self._running if not self._ctx[r]]
        if not ready:
            return
        t0 = time.perf_counter()
        self.dec.append([[] for _ in range(self.rows)])  # feeds last step's sampled tokens (if any)
        groups: dict[tuple[float, float], list[int]] = {}
        for r in ready:
            req = self._running[r]
            groups.setdefault((req.temperature, req.top_p), []).append(r)
        for (temperature, top_p), rows in groups.items():
            active = [False] * self.rows
            forced: list[list[int] | None] = [None] * self.rows
            for r in rows:
                active[r] = True
                req = self._running[r]
                if req.forced is not None:
                    forced[r] = [req.forced[len(req.ids)]]
                if req.top_logprobs:
                    req.tops.append(self._top(r, temperature, req.top_logprobs))
            acts = self.dec.sample(active=active, temperature=temperature, top_p=top_p, max_new_tokens=1,
                                   forced=forced, generator=self.generator)
            for r in rows:
                act = acts[r]
                assert act is not None
                req = self._running[r]
                tok = act.ids[0]
                req.ids.append(tok)
                req.logprobs.append(act.logprobs[0])
                self.hist[r].append(tok)
                if req.on_token is not None:
                    req.on_token(tok)
        dt = time.perf_counter() - t0
        self.steps += 1
        self.tokens += len(ready)
        if self.on_step is not None:
            self.on_step(len(ready), dt)
        now = time.perf_counter()
        for r in ready:
            req = self._running[r]
            stop = req.ids[-1] == self.actor.stop_id
            forced_done = req.forced is not None and len(req.ids) >= len(req.forced)
            if stop or forced_done or len(req.ids) >= req.max_new_tokens:
                del self._running[r]
                req.future.set_result(TurnResult(
                    ids=req.ids, logprobs=req.logprobs, hit_cap=not stop, forced=req.forced is not None,
                    queue_s=req.started - req.submitted, decode_s=now - req.started, explored=req.explored,
                    top_logprobs=req.tops,
                ))

    def _top(self, row: int, temperature: float, k: int) -> list[tuple[int, float]]:
        """Row ``row``'s ``k`` most likely next tokens and their log-probs, before this step samples."""
        logits = self.dec.last_logits[row].float()
        logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), -1)
        vals, ids = logp.topk(min(k, logp.shape[-1]))
        return list(zip(ids.tolist(), vals.tolist()))
