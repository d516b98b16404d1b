"""``polyturn rate``: a local web page for blind pairwise ratings (a small FastAPI app under uvicorn, as ``serve``).

The page shows one pair at a time: the task, then the two transcripts side by
side (which policy is left was drawn with a seeded RNG, and stays hidden).
The rater clicks *Left is better*, *Right is better* or *Tie*; the choice is
appended at once to the ratings JSONL file (with the true identity of both
sides), so closing the page loses nothing and restarting resumes with the
first unrated pair.

Routes: ``GET /`` (redirects to the next unrated pair, or ``/done``),
``GET /pair/<i>``, ``POST /rate`` (form fields ``pair``, ``choice``),
``GET /done`` (the win rate so far), ``GET /api/state`` (JSON).
The server binds to 127.0.0.1 only. The app is built here rather than taken
from ``serve/``: evaluation may not import the serving layer, and the two share
nothing but FastAPI itself.
"""

from __future__ import annotations

import html
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from polyturn.acting.jsonl import append_jsonl, read_jsonl
from polyturn.eval import records as R
from polyturn.eval.preference import Pair, rating_record, win_rate

_PAGE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>
body{{font-family:system-ui,sans-serif;margin:16px;color:#222}} .cols{{display:flex;gap:16px}}
.col{{flex:1;min-width:0;border:1px solid #ccc;border-radius:6px;padding:8px}}
.turn{{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px;margin:4px 0;padding:4px;border-radius:4px}}
.user{{background:#eef5ff}} .agent{{background:#f4f4f4}} .env{{background:#fffbe8}} .crash{{background:#fde8e8}}
form button{{font-size:16px;margin:8px;padding:8px 18px}}</style></head><body>{body}</body></html>"""


class RatingSession:
    """The pairs to rate, the ratings file, and which pairs this rater has done (thread-safe appends).

    Every rater (a person, the heuristic, an LLM judge) goes through a session, so each
    rating is on disk as soon as it is made and a rerun resumes at the pairs still
    missing. Ratings by other raters in the same file are kept apart.
    """

    def __init__(self, pairs: Sequence[Pair], out: str | Path, *, seed: int = 0, rater: str = "human") -> None:
        self.pairs = list(pairs)
        self.out = Path(out)
        self.seed = seed
        self.rater = rater
        self.lock = threading.Lock()
        self.rated: set[int] = set()
        if self.out.is_dir():
            raise ValueError(f"Expected a ratings JSONL file, got the directory {self.out}; pass --out FILE.jsonl")
        if self.out.is_file():
            for r in read_jsonl(self.out):
                if self._ours(r):
                    self.rated.add(int(r["pair"]))

    def _ours(self, r: dict[str, Any]) -> bool:
        names = (self.pairs[0].a_name, self.pairs[0].b_name) if self.pairs else None
        return (r.get("a_policy"), r.get("b_policy")) == names and r.get("rater") == self.rater

    def next_unrated(self) -> int | None:
        """The first pair without a rating, or None when all are rated."""
        return next((p.index for p in self.pairs if p.index not in self.rated), None)

    def rate(self, index: int, choice: str | None, *, raw: str | None = None) -> dict[str, Any]:
        """Record a choice for pair ``index`` (appended to the ratings file).

        ``raw`` is a judge's reply; with it, ``choice`` may be None (an unparseable verdict,
        kept and counted as invalid by :func:`win_rate`).
        """
        if not 0 <= index < len(self.pairs):
            raise ValueError(f"Expected a pair index in 0..{len(self.pairs) - 1}, got {index}")
        if choice not in ("left", "right", "tie") and not (choice is None and raw is not None):
            raise ValueError(f"Expected choice left, right or tie, got {choice!r}")
        rec = rating_record(self.pairs[index], choice, rater=self.rater, seed=self.seed, raw=raw)  # type: ignore[arg-type]
        with self.lock:
            append_jsonl(self.out, rec)
            self.rated.add(index)
        return rec

    def ratings(self) -> list[dict[str, Any]]:
        """This comparison's ratings by this rater in the file so far."""
        if not self.out.is_file():
            return []
        return [r for r in read_jsonl(self.out) if self._ours(r)]


def _transcript_html(record: dict[str, Any]) -> str:
    parts = []
    for role, text in R.transcript(record, max_chars=2000):
        parts.append(f'<div class="turn {role}"><b>{role}</b>: {html.escape(text)}</div>')
    return "".join(parts)


def pair_page(session: RatingSession, index: int) -> str:
    """The HTML page of one pair."""
    p = session.pairs[index]
    question = p.a.get("question") or ""
    body = (
        f"<h2>Pair {index + 1} of {len(session.pairs)} ({len(session.rated)} rated)</h2>"
        f"<p><b>Task:</b> {html.escape(str(question))}</p>"
        '<div class="cols">'
        f'<div class="col" id="left"><h3>Left</h3>{_transcript_html(p.left_record)}</div>'
        f'<div class="col" id="right"><h3>Right</h3>{_transcript_html(p.right_record)}</div></div>'
        '<form method="post" action="/rate">'
        f'<input type="hidden" name="pair" value="{index}">'
        '<button name="choice" value="left">Left is better</button>'
        '<button name="choice" value="tie">Tie</button>'
        '<button name="choice" value="right">Right is better</button></form>'
    )
    return _PAGE.format(title=f"polyturn rate: pair {index + 1}", body=body)


def done_page(session: RatingSession) -> str:
    """The summary page: the win rate so far."""
    wr = win_rate(session.ratings())
    body = f"<h2>All {len(session.pairs)} pairs rated</h2><p id=\"summary\">{html.escape(wr.summary())}</p>"
    return _PAGE.format(title="polyturn rate: done", body=body)


def create_app(session: RatingSession) -> FastAPI:
    """The rating page's routes over ``session`` (see the module docstring)."""
    app = FastAPI(title="polyturn rate", docs_url=None, redoc_url=None, openapi_url=None)
    last = len(session.pairs) - 1

    @app.get("/")
    def index() -> Response:
        nxt = session.next_unrated()
        return RedirectResponse("/done" if nxt is None else f"/pair/{nxt}", status_code=303)

    @app.get("/pair/{index}")
    def pair(index: str) -> Response:
        if not (index.isdigit() and int(index) <= last):
            return HTMLResponse(f"Expected /pair/<0..{last}>, got /pair/{html.escape(index)}", status_code=404)
        return HTMLResponse(pair_page(session, int(index)))

    @app.get("/done")
    def done() -> Response:
        return HTMLResponse(done_page(session))

    @app.get("/api/state")
    def state() -> Response:
        return JSONResponse({"pairs": len(session.pairs), "rated": sorted(session.rated), "next": session.next_unrated()})

    @app.post("/rate")
    async def rate(request: Request) -> Response:
        # A plain urlencoded form, parsed here: FastAPI's Form() would need python-multipart for two fields.
        form = parse_qs((await request.body()).decode("utf-8"))
        try:
            session.rate(int(form.get("pair", ["-1"])[0]), form.get("choice", [""])[0])
        except ValueError as e:
            return HTMLResponse(html.escape(str(e)), status_code=400)
        return RedirectResponse("/", status_code=303)

    return app


class RateServer:
    """The rating app under uvicorn on a socket bound at construction (so a busy port fails at once).

    ``serve_forever`` blocks until ``shutdown`` (from another thread) or Ctrl-C (uvicorn's own handler,
    in the main thread); ``server_address`` is the bound ``(host, port)``.
    """

    def __init__(self, app: FastAPI, sock: socket.socket) -> None:
        self.sock = sock
        self.server_address = sock.getsockname()
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._stopped = threading.Event()

    def serve_forever(self) -> None:
        """Serve until shut down."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Ask the server to stop and wait until it has (at most 10 s)."""
        self.server.should_exit = True
        self._stopped.wait(10)

    def server_close(self) -> None:
        """Close the listening socket."""
        self.sock.close()


def make_server(session: RatingSession, *, port: int = 8765, host: str = "127.0.0.1") -> RateServer:
    """A (not yet started) rating server; ``port=0`` picks a free port (see ``server.server_address``).

    A port in use raises OSError here, before anything is served.
    """
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"Expected a loopback host (the rating page is local only), got {host!r}")
    family = socket.AF_INET6 if host == "::1" else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)  # connections made before uvicorn starts wait in the backlog
    except OSError:
        sock.close()
        raise
    return RateServer(create_app(session), sock)
