"""The FastAPI app: routes, error shapes, body-size cap, metrics, the session reaper.

``create_app(ServeConfig(...))`` loads every checkpoint at startup (one engine
per version) and closes every session (recording it) at shutdown. Every error
answers in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``;
malformed JSON, wrong types and oversize bodies are 4xx, never 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from polyturn.serve import admin_api, openai_api, sessions_api
from polyturn.serve.conversation import RequestError
from polyturn.serve.engine import EngineFull
from polyturn.serve.page import INDEX_HTML
from polyturn.serve.service import ModelNotFound, ServeConfig, Service
from polyturn.serve.sessions import SessionNotFound

log = logging.getLogger(__name__)


def error_body(message: str, *, kind: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 before any route reads it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_big = declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes)
        chunks: list[bytes] = []
        size = 0
        more = True
        while more and not too_big:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
            too_big = size > self.max_bytes
        if too_big:
            resp = JSONResponse(error_body(f"Expected a request body of at most {self.max_bytes} bytes, got more",
                                           kind="invalid_request_error", code="body_too_large"), status_code=413)
            await resp(scope, receive, send)
            return
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _validation_message(exc: RequestValidationError, content_type: str | None = None) -> str:
    parts = []
    media = (content_type or "").split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        # FastAPI reads a body as JSON only when it says so; curl's -d says application/x-www-form-urlencoded.
        return (f"Invalid request: Expected a JSON body with Content-Type: application/json, got Content-Type: "
                f"{media} (curl -d sends that: add -H 'Content-Type: application/json')")
    for e in exc.errors()[:5]:
        if e.get("type") == "json_invalid":
            parts.append(f"Expected a JSON body, got invalid JSON ({e.get('ctx', {}).get('error', 'decode error')} "
                         f"at character {e.get('loc', ('', '?'))[-1]})")
            continue
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg')}")
    return "Invalid request: " + "; ".join(parts)


def create_app(config: ServeConfig, *, service: Service | None = None) -> FastAPI:
    """The app serving ``config.checkpoints`` (loaded at startup)."""
    service = service or Service(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        """Load the versions, run the reaper (expiry, ramp ticks); at shutdown close and record every session."""
        if not service.versions:
            for path in config.checkpoints:
                await asyncio.to_thread(service.load_version, path)

        async def reaper() -> None:
            while True:
                await asyncio.sleep(config.reap_every_s)
                try:
                    service.reap()
                    if service.router is not None:
                        service.router.tick()
                        service.update_share_gauges()
                except Exception:  # logged; expiry and the ramp go on at the next tick
                    log.exception("reaper tick failed")

        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            service.shutdown()

    app = FastAPI(title="polyturn serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    app.include_router(openai_api.router)
    app.include_router(sessions_api.router)
    app.include_router(admin_api.router)

    def tally(request: Request, status: int) -> None:
        """Count a request and its error per arm and endpoint; agent endpoints feed the router's error rate.

        A streamed completion feeds the router when its stream ends instead (``openai_api``): an error after
        the 200 is known only then.
        """
        endpoint = getattr(request.scope.get("route"), "path", "unmatched")
        arm = getattr(request.state, "arm", "") or ""
        service.metrics.requests.labels(arm, endpoint).inc()
        if not getattr(request.state, "streamed", False):
            service.count_outcome(arm, endpoint, status)

    @app.middleware("http")
    async def count(request: Request, call_next):
        """Count every request (:func:`tally`); an unhandled exception counts as the 500 it becomes.

        The catch-all handler that turns it into a 500 runs outside this middleware, so the exception is
        counted here and re-raised to it.
        """
        t0 = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:
            tally(request, 500)
            raise
        tally(request, response.status_code)
        response.headers["x-process-time"] = f"{time.perf_counter() - t0:.4f}"
        return response

    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message = _validation_message(exc, request.headers.get("content-type"))
        return JSONResponse(error_body(message, kind="invalid_request_error"), status_code=400)

    @app.exception_handler(RequestError)
    async def _bad(request: Request, exc: RequestError):
        return JSONResponse(error_body(str(exc), kind="invalid_request_error"), status_code=400)

    @app.exception_handler(SessionNotFound)
    async def _no_session(request: Request, exc: SessionNotFound):
        return JSONResponse(error_body(exc.args[0], kind="not_found_error", code="session_not_found"), status_code=404)

    @app.exception_handler(ModelNotFound)
    async def _no_model(request: Request, exc: ModelNotFound):
        return JSONResponse(error_body(exc.args[0], kind="invalid_request_error", code="model_not_found",
                                       param="model"), status_code=404)

    @app.exception_handler(EngineFull)
    @app.exception_handler(OverflowError)
    async def _full(request: Request, exc: Exception):
        return JSONResponse(error_body(str(exc), kind="server_busy", code="capacity"), status_code=503,
                            headers={"retry-after": "1"})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}.get(
            exc.status_code, "invalid_request_error")
        return JSONResponse(error_body(str(exc.detail), kind=kind), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error on %s", request.url.path)
        # The server closes the connection after an unhandled error: say so, or a keep-alive client's next request
        # on it is reset.
        return JSONResponse(error_body("Internal server error", kind="server_error"), status_code=500,
                            headers={"connection": "close"})

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        """The chat page."""
        return INDEX_HTML

    @app.get("/health")
    async def health() -> dict:
        """Liveness and the loaded versions."""
        return {"status": "ok", "versions": sorted(service.versions), "sessions": len(service.store),
                "engines": {n: v.engine.stats() for n, v in service.versions.items()}
                | {f"{n}/manager": v.manager.engine.stats() for n, v in service.versions.items() if v.manager}}

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text format."""
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
