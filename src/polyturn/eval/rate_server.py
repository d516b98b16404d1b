"""``polyturn rate``: a local web page for blind pairwise ratings (stdlib ``http.server`` only).

The page shows one pair at a time: the task, then the two transcripts side by
side (which policy is left was drawn with a seeded RNG, and stays hidden).
The rater clicks *Left is better*, *Right is better* or *Tie*; the choice is
appended at once to the ratings JSONL file (with the true identity of both
sides), so closing the page loses nothing and restarting resumes with the
first unrated pair.

Routes: ``GET /`` (redirects to the next unrated pair, or ``/done``),
``GET /pair/<i>``, ``POST /rate`` (form fields ``pair``, ``choice``),
``GET /done`` (the win rate so far), ``GET /api/state`` (JSON).
The server binds to 127.0.0.1 only.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

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


def make_handler(session: RatingSession) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to ``session``."""

    class Handler(BaseHTTPRequestHandler):
        """Serves the pages of one :class:`RatingSession`."""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (quiet: library code does not print)
            pass

        def _send(self, code: int, body: str, ctype: str = "text/html; charset=utf-8") -> None:
            data = body.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _redirect(self, where: str) -> None:
            self.send_response(303)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/":
                nxt = session.next_unrated()
                self._redirect("/done" if nxt is None else f"/pair/{nxt}")
            elif path.startswith("/pair/"):
                try:
                    index = int(path.rsplit("/", 1)[1])
                    if not 0 <= index < len(session.pairs):
                        raise ValueError
                except ValueError:
                    self._send(404, f"Expected /pair/<0..{len(session.pairs) - 1}>, got {html.escape(path)}")
                    return
                self._send(200, pair_page(session, index))
            elif path == "/done":
                self._send(200, done_page(session))
            elif path == "/api/state":
                state = {"pairs": len(session.pairs), "rated": sorted(session.rated), "next": session.next_unrated()}
                self._send(200, json.dumps(state), "application/json")
            else:
                self._send(404, "Not found")

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?", 1)[0] != "/rate":
                self._send(404, "Not found")
                return
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode("utf-8"))
            try:
                session.rate(int(form.get("pair", ["-1"])[0]), form.get("choice", [""])[0])
            except ValueError as e:
                self._send(400, html.escape(str(e)))
                return
            self._redirect("/")

    return Handler


def make_server(session: RatingSession, *, port: int = 8765, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A (not yet started) rating server; ``port=0`` picks a free port (see ``server.server_address``)."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"Expected a loopback host (the rating page is local only), got {host!r}")
    return ThreadingHTTPServer((host, port), make_handler(session))
