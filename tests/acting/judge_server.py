"""A real local HTTP server speaking OpenAI's chat-completions protocol, for the judge's client tests.

``max_in_flight`` is the most requests it was answering at once.

Not a mock of the client: the real ``openai`` client talks HTTP to it. It answers ``reply(prompt)`` (default a fixed
"Score: 7"), fails the first ``fail_first`` requests with HTTP ``fail_code`` (a 10 ms ``retry-after-ms`` keeps the
client's retries fast) and waits ``delay`` seconds before answering (``delay_first``: only the first requests). A
request asking for ``logprobs`` gets ``top_logprobs(prompt)`` (``{token: logprob}``) as its first token's, when given.

:func:`oracle` is a judge that knows the outcomes of given records (the judge's prompt no longer shows the env's
verdict, so a test's judge cannot read it there).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from polyturn.acting.judge import EPISODE_TEMPLATE, YES_NO_TEMPLATE, judge_prompt


def oracle(records: Sequence[dict], yes: str = "Looks right.\nScore: 8", no: str = "Score: 2",
           unknown: str = "Score: 5") -> Callable[[str], str]:
    """A reply function that answers ``yes`` to the judge prompt (either template) of a record that succeeded, ``no``
    to one that failed and ``unknown`` to any other prompt."""
    known = {judge_prompt(r, t): bool(r.get("success")) for r in records for t in (EPISODE_TEMPLATE, YES_NO_TEMPLATE)}
    return lambda prompt: unknown if prompt not in known else yes if known[prompt] else no


class JudgeServer:
    """``with JudgeServer(...) as srv:`` serves on ``srv.url`` (a ``/v1`` base URL); ``srv.prompts`` lists what came
    (``srv.bodies``: the whole requests)."""

    def __init__(self, reply: Callable[[str], str] = lambda prompt: "Fine.\nScore: 7", *, fail_first: int = 0,
                 fail_code: int = 500, delay: float = 0.0, delay_first: int | None = None,
                 top_logprobs: Callable[[str], dict[str, float]] | None = None) -> None:
        self.prompts: list[str] = []
        self.bodies: list[dict] = []  # the requests' JSON bodies
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.prompts.append(body["messages"][-1]["content"])
                    owner.bodies.append(body)
                    n = len(owner.prompts)
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                if delay and (delay_first is None or n <= delay_first):
                    time.sleep(delay)
                if n <= fail_first:
                    payload, code = {"error": {"message": "the judge fell over"}}, fail_code
                else:
                    prompt = body["messages"][-1]["content"]
                    choice = {"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": reply(prompt)}}
                    if body.get("logprobs") and top_logprobs is not None:
                        top = [{"token": t, "logprob": lp, "bytes": None} for t, lp in top_logprobs(prompt).items()]
                        top = top[: body.get("top_logprobs") or 0]
                        choice["logprobs"] = {"content": [{**top[0], "top_logprobs": top}] if top else []}
                    payload = {"id": f"c{n}", "object": "chat.completion", "model": body["model"], "created": 0,
                               "choices": [choice]}
                    code = 200
                data = json.dumps(payload).encode()
                with owner.lock:
                    owner.in_flight -= 1
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("retry-after-ms", "10")
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> JudgeServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
