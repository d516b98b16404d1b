"""The unbatched baseline: one request at a time, each session with its own single-row cache.

``polyturn serve --unbatched`` uses it; ``benchmarks/serve_load.py`` measures
batching against it. It keeps everything but the batching: a session's cache
persists across its turns (a turn prefills only its new tokens), and each
turn is sampled by :meth:`BatchDecoder.sample` on that session's own
decoder, so a request's cost is its own tokens only, never other rows'.
"""

from __future__ import annotations

import logging
import time

from polyturn.rollout.generate import BatchDecoder
from polyturn.serve.engine import Engine, TurnRequest, TurnResult
from polyturn.serve.explore import pick_candidate

log = logging.getLogger(__name__)


class UnbatchedEngine(Engine):
    """Same interface as :class:`Engine`; requests are served strictly first come, first served."""

    reports_top_logprobs = False  # the whole action is sampled in one call

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._decoders: dict[int, BatchDecoder] = {}  # id(slot) -> its own decoder
        self._hist: dict[int, list[int]] = {}

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._queue or self._released):
                    self._cond.wait(timeout=0.5)
                if self._stop:
                    break
                released, self._released = self._released, []
                req = self._queue.pop(0) if self._queue else None
            for slot in released:
                self._decoders.pop(id(slot), None)
                self._hist.pop(id(slot), None)
            if req is None:
                continue
            try:
                self._serve(req)
            except Exception as exc:  # a failed forward fails its request, never the thread
                log.exception("engine %s turn failed", self.version)
                self._decoders.pop(id(req.slot), None)
                if not req.future.done():
                    req.future.set_exception(exc)
        with self._cond:
            pending = list(self._queue)
        for req in pending:
            if not req.future.done():
                req.future.set_exception(RuntimeError(f"Engine {self.version} stopped"))

    def _serve(self, req: TurnRequest) -> None:
        if req.slot.closed:
            req.future.set_exception(ValueError("Expected an open session, got a closed one"))
            return
        key = id(req.slot)
        req.started = time.perf_counter()
        if req.restart or key not in self._decoders:
            dec = BatchDecoder(self.actor.model, pad_id=self.actor.pad_id, stop_id=self.actor.stop_id,
                               autocast=self.actor.autocast)
            dec.reset([list(req.context)])
            self._decoders[key], self._hist[key] = dec, list(req.context)
        else:
            dec = self._decoders[key]
            dec.append([list(req.context)])
            self._hist[key] += req.context
        if req.explore and self.explore.candidates > 0:
            req.forced, req.explored = pick_candidate(self.actor, self._hist[key], self.explore,
                                                      max_new_tokens=req.max_new_tokens, generator=self.generator)
        t0 = time.perf_counter()
        (act,) = dec.sample(active=[True], temperature=req.temperature, top_p=req.top_p,
                            max_new_tokens=req.max_new_tokens, forced=[req.forced], generator=self.generator)
        dt = time.perf_counter() - t0
        assert act is not None
        self._hist[key] += act.ids
        self.steps += len(act.ids)
        self.tokens += len(act.ids)
        for tok in act.ids:
            if self.on_step is not None:
                self.on_step(1, dt / max(1, len(act.ids)))
            if req.on_token is not None:
                req.on_token(tok)
        req.future.set_result(TurnResult(
            ids=list(act.ids), logprobs=list(act.logprobs), hit_cap=act.hit_cap, forced=req.forced is not None,
            queue_s=req.started - req.submitted, decode_s=time.perf_counter() - req.started, explored=req.explored,
        ))
