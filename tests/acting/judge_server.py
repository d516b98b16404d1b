"""A real local HTTP server speaking OpenAI's chat-completions protocol, for the judge's client tests.

``max_in_flight`` is the most requests it was answering at once.

Not a mock of the client: the real ``openai`` client talks HTTP to it. It answers ``reply(prompt)`` (default a fixed
"Score: 7"), fails the first ``fail_first`` requests with HTTP ``fail_code`` (a 10 ms ``retry-after-ms`` keeps the
client's retries fast) and waits ``delay`` seconds before answering (``delay_first``: only the first requests).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JudgeServer:
    """``with JudgeServer(...) as srv:`` serves on ``srv.url`` (a ``/v1`` base URL); ``srv.prompts`` lists what came."""

    def __init__(self, reply: Callable[[str], str] = lambda prompt: "Fine.\nScore: 7", *, fail_first: int = 0,
                 fail_code: int = 500, delay: float = 0.0, delay_first: int | None = None) -> None:
        self.prompts: list[str] = []
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
                    n = len(owner.prompts)
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                if delay and (delay_first is None or n <= delay_first):
                    time.sleep(delay)
                if n <= fail_first:
                    payload, code = {"error": {"message": "the judge fell over"}}, fail_code
                else:
                    payload = {"id": f"c{n}", "object": "chat.completion", "model": body["model"], "created": 0,
                               "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                   "role": "assistant", "content": reply(body["messages"][-1]["content"])}}]}
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
