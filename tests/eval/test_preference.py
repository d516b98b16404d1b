"""Pairwise preference: pairing, win rates, judges, and the rating web server over real HTTP."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from polyturn.acting.jsonl import write_jsonl
from polyturn.eval.preference import (
    chat_completion_judge,
    heuristic_judge_pairs,
    heuristic_verdict,
    judge_pairs,
    judge_prompt,
    load_side,
    make_pairs,
    parse_verdict,
    rating_record,
    win_rate,
)
from polyturn.eval.rate_server import RatingSession, make_server


@pytest.fixture()
def sides(ep):
    a = [ep.expert_like(f"c{i}", success=True) for i in range(6)]
    b = [ep.expert_like(f"c{i}", success=i < 2) for i in range(6)] + [ep.expert_like("only-b")]
    return a, b


def test_pairs_match_cases_and_the_order_is_seeded(sides):
    a, b = sides
    p1 = make_pairs(a, b, a_name="A", b_name="B", seed=3)
    p2 = make_pairs(a, b, a_name="A", b_name="B", seed=3)
    assert [p.key for p in p1] == [f"c{i}" for i in range(6)]  # only-b has no partner
    assert [p.left for p in p1] == [p.left for p in p2]
    orders = {tuple(p.left for p in make_pairs(a, b, a_name="A", b_name="B", seed=s)) for s in range(8)}
    assert len(orders) > 1 and {"A", "B"} <= {x for o in orders for x in o}
    with pytest.raises(ValueError, match="same test cases"):
        make_pairs(a[:1], b[2:3], a_name="A", b_name="B")


def test_rating_records_keep_the_true_identity(sides):
    a, b = sides
    pair = next(p for p in make_pairs(a, b, a_name="A", b_name="B", seed=0) if p.left == "B")
    rec = rating_record(pair, "left", rater="human")
    assert (rec["left"], rec["right"], rec["winner"]) == ("B", "A", "B")
    assert rec["left_policy"] == "B" and rec["case_id"] == pair.key
    assert rating_record(pair, "right", rater="human")["winner"] == "A"
    assert rating_record(pair, "tie", rater="human")["winner"] == "tie"


def test_win_rate_counts_ties_half_with_a_wilson_interval():
    recs = [{"a_policy": "A", "b_policy": "B", "winner": w} for w in ["A"] * 6 + ["B"] * 2 + ["tie"] * 2 + [None]]
    wr = win_rate(recs)
    assert (wr.wins_a, wr.wins_b, wr.ties, wr.invalid, wr.n) == (6, 2, 2, 1, 10)
    assert wr.rate == pytest.approx(0.7)
    assert wr.lo == pytest.approx(0.3968, abs=1e-3) and wr.hi == pytest.approx(0.8922, abs=1e-3)
    assert "win rate 0.700" in wr.summary()
    with pytest.raises(ValueError, match="one A/B comparison"):
        win_rate(recs + [{"a_policy": "A", "b_policy": "C", "winner": "A"}])


def test_parse_verdict():
    assert parse_verdict("Assistant 1 answered correctly.\nVerdict: 1") == "left"
    assert parse_verdict("...**Verdict:** 2") == "right"
    assert parse_verdict("Verdict: [[tie]]") == "tie"
    assert parse_verdict("I first thought Verdict: 1 but actually Verdict: 2") == "right"
    assert parse_verdict("2") == "right"
    assert parse_verdict("Both are fine.") is None


def test_judge_pairs_with_a_fake_judge(sides):
    a, b = sides
    pairs = make_pairs(a, b, a_name="A", b_name="B", seed=1)
    prompts = []

    def fake_judge(prompt: str) -> str:  # prefers the transcript whose answer was correct
        prompts.append(prompt)
        left, right = prompt.split("[Assistant 2]")
        good_l, good_r = "correct." in left.replace("incorrect.", ""), "correct." in right.replace("incorrect.", "")
        return "Reasoning...\nVerdict: " + ("1" if good_l and not good_r else "2" if good_r and not good_l else "tie")

    ratings = judge_pairs(pairs, fake_judge)
    assert len(prompts) == 6 and "Verdict: 1" in prompts[0] and pairs[0].a["question"] in prompts[0]
    wr = win_rate(ratings)
    assert (wr.wins_a, wr.wins_b, wr.ties) == (4, 0, 2)
    assert all(r["rater"] == "llm-judge" and r["raw"].startswith("Reasoning") for r in ratings)
    unparsed = judge_pairs(pairs[:2], lambda p: "no idea")
    assert win_rate(unparsed).invalid == 2 and win_rate(unparsed).rate is None


def test_heuristic_judge_orders_success_then_turns_then_errors(ep):
    ok = ep.expert_like("x")
    fail = ep.expert_like("x", success=False)
    assert heuristic_verdict(ok, fail) == "left" and heuristic_verdict(fail, ok) == "right"
    shorter = ep.record(ok["turns"][:1] + ok["turns"][3:], success=True)
    assert heuristic_verdict(ok, shorter) == "right"
    noisy = ep.record([dict(t, _after="x") for t in ok["turns"]], success=True)
    noisy["turns"][0]["info"]["error"] = "repeat"
    assert heuristic_verdict(noisy, ok) == "right" and heuristic_verdict(ok, ok) == "tie"


def test_prompt_puts_the_left_side_first(sides):
    a, b = sides
    pair = next(p for p in make_pairs(a, b, a_name="A", b_name="B", seed=0) if p.key == "c4")
    prompt = judge_prompt(pair)
    first = prompt.split("[Assistant 2]")[0]
    assert ("incorrect." in first) == (pair.left == "B")


def test_load_side_from_an_evaluate_dir_and_a_file(tmp_path, sides):
    a, _ = sides
    write_jsonl(tmp_path / "run1" / "episodes" / "ckpt-a.jsonl", a)
    assert load_side(tmp_path / "run1")[0] == "ckpt-a"
    assert len(load_side(tmp_path / "run1" / "episodes" / "ckpt-a.jsonl")[1]) == 6
    write_jsonl(tmp_path / "run1" / "episodes" / "expert.jsonl", a)
    with pytest.raises(ValueError, match="pass one of"):
        load_side(tmp_path / "run1")
    with pytest.raises(FileNotFoundError):
        load_side(tmp_path / "missing")


# ---- the web page, over real HTTP ----------------------------------------------------------------
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003
        return None


def _get(url: str, *, follow: bool = True):
    opener = urllib.request.build_opener() if follow else urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(url, timeout=10) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


def _post(url: str, form: dict):
    data = urllib.parse.urlencode(form).encode()
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, data=data, method="POST"), timeout=10) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


@pytest.fixture()
def server(tmp_path, sides):
    a, b = sides
    pairs = make_pairs(a, b, a_name="A", b_name="B", seed=7)
    session = RatingSession(pairs, tmp_path / "ratings.jsonl", seed=7)
    srv = make_server(session, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    host, port = srv.server_address[:2]
    yield f"http://{host}:{port}", session, pairs
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def test_rating_page_round_trip(server, tmp_path):
    base, session, pairs = server
    status, _, headers = _get(base + "/", follow=False)
    assert status == 303 and headers["Location"] == "/pair/0"
    status, page, _ = _get(base + "/")
    assert status == 200 and "Pair 1 of 6" in page and 'name="pair" value="0"' in page
    assert pairs[0].a["question"] in page and 'id="left"' in page and 'id="right"' in page
    assert "A" not in re.findall(r"<h3>(\w+)</h3>", page)  # identities stay hidden

    choices = ["left", "right", "tie", "left", "left", "right"]
    for i, choice in enumerate(choices):
        status, headers = _post(base + "/rate", {"pair": str(i), "choice": choice})
        assert status == 303 and headers["Location"] == "/"
    lines = [json.loads(x) for x in (tmp_path / "ratings.jsonl").read_text().splitlines()]
    assert [r["choice"] for r in lines] == choices
    for r, p in zip(lines, pairs):
        assert r["case_id"] == p.key and r["left"] == p.left
        assert r["left_policy"] == ("A" if p.left == "A" else "B")
        assert r["winner"] == ("tie" if r["choice"] == "tie" else (r["left"] if r["choice"] == "left" else r["right"]))
    status, page, _ = _get(base + "/")
    assert status == 200 and "All 6 pairs rated" in page and "win rate" in page
    state = json.loads(_get(base + "/api/state")[1])
    assert state == {"pairs": 6, "rated": list(range(6)), "next": None}


def test_rating_page_rejects_bad_input_and_resumes(server, tmp_path):
    base, session, pairs = server
    assert _post(base + "/rate", {"pair": "0", "choice": "maybe"})[0] == 400
    assert _post(base + "/rate", {"pair": "99", "choice": "left"})[0] == 400
    assert _get(base + "/pair/99")[0] == 404
    assert _post(base + "/rate", {"pair": "0", "choice": "tie"})[0] == 303
    resumed = RatingSession(pairs, tmp_path / "ratings.jsonl")
    assert resumed.next_unrated() == 1


def test_server_binds_loopback_only(tmp_path, sides):
    a, b = sides
    session = RatingSession(make_pairs(a, b, a_name="A", b_name="B"), tmp_path / "r.jsonl")
    with pytest.raises(ValueError, match="loopback"):
        make_server(session, host="0.0.0.0", port=0)


def test_heuristic_ratings_match_the_known_winner(sides):
    a, b = sides
    wr = win_rate(heuristic_judge_pairs(make_pairs(a, b, a_name="A", b_name="B", seed=2)))
    assert (wr.wins_a, wr.wins_b, wr.ties) == (4, 0, 2)


class _ChatServer:
    """A real HTTP server speaking the OpenAI chat-completions protocol, judging like ``fake_judge``
    above (prefers the transcript whose answer was correct). It answers HTTP ``fail_code`` to every
    request after ``fail_after`` and to the first ``fail_first`` requests, each time with a 10 ms
    ``retry-after-ms`` so the client's retries stay fast; it waits ``delay`` seconds before answering."""

    def __init__(self, fail_after: int | None = None, *, fail_first: int = 0, fail_code: int = 429,
                 delay: float = 0.0):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[tuple[dict, dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                time.sleep(delay)
                n = len(owner.requests)
                if (fail_after is not None and n > fail_after) or n <= fail_first:
                    payload, code = {"error": {"message": "rate limited"}}, fail_code
                else:
                    left, right = body["messages"][0]["content"].split("[Assistant 2]")
                    good_l = "correct." in left.replace("incorrect.", "")
                    good_r = "correct." in right.replace("incorrect.", "")
                    verdict = "1" if good_l and not good_r else "2" if good_r and not good_l else "tie"
                    payload = {"id": "x", "object": "chat.completion", "model": body["model"], "created": 0,
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": f"Because.\nVerdict: {verdict}"}}]}
                    code = 200
                data = json.dumps(payload).encode()
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
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _rate_llm(tmp_path, sides, url, *extra):
    from polyturn.cli import main

    a, b = sides
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    out = tmp_path / "ratings.jsonl"
    rc = main(["rate", "--pairs", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--judge", "llm",
               "--judge_url", url, "--out", str(out), *extra])
    return rc, [json.loads(x) for x in out.read_text().splitlines()] if out.is_file() else []


def test_llm_judge_over_an_openai_compatible_http_server(tmp_path, sides, monkeypatch):
    from polyturn.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    write_jsonl(tmp_path / "a.jsonl", sides[0])
    write_jsonl(tmp_path / "b.jsonl", sides[1])
    # Heuristic ratings already in the file are another rater's: the judge still rates every pair.
    assert main(["rate", "--pairs", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--judge", "heuristic",
                 "--out", str(tmp_path / "ratings.jsonl")]) == 0
    srv = _ChatServer()
    try:
        rc, recs = _rate_llm(tmp_path, sides, srv.url, "--judge_model", "judge-1")
    finally:
        srv.close()
    assert sum(r["rater"] == "heuristic" for r in recs) == 6
    recs = [r for r in recs if r["rater"] != "heuristic"]
    assert rc == 0 and len(recs) == 6 == len(srv.requests)
    headers, body = srv.requests[0]
    assert headers["authorization"] == "Bearer sk-test" and body["model"] == "judge-1" and body["temperature"] == 0
    # A always answered correctly, B only on c0 and c1: 4 wins for A, 2 ties, whatever side A was shown on.
    wr = win_rate(recs)
    assert (wr.wins_a, wr.wins_b, wr.ties) == (4, 0, 2)
    assert {r["left"] for r in recs} == {"A", "B"}
    assert all(r["rater"] == "llm-judge:judge-1" and r["raw"].endswith("Verdict: " + {"left": "1", "right": "2", "tie": "tie"}[r["choice"]])
               for r in recs)


def test_llm_judge_errors_are_messages_and_keep_finished_verdicts(tmp_path, sides, capsys):
    srv = _ChatServer(fail_after=3)
    try:
        rc, recs = _rate_llm(tmp_path, sides, srv.url, "--judge_model", "judge-1")
    finally:
        srv.close()
    assert rc == 2 and len(recs) == 3  # the three verdicts before the failure are on disk
    assert len(srv.requests) == 3 + 3  # the fourth call was tried three times (the client's two retries)
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "HTTP 429" in err and "rate limited" in err and "Traceback" not in err
    # Rerunning resumes: only the three unjudged pairs are sent.
    srv = _ChatServer()
    try:
        rc, recs = _rate_llm(tmp_path, sides, srv.url, "--judge_model", "judge-1")
    finally:
        srv.close()
    assert rc == 0 and len(srv.requests) == 3 and len(recs) == 6
    assert sorted(r["case_id"] for r in recs) == sorted({r["case_id"] for r in recs})
    said = capsys.readouterr()
    assert "3 of 6 pairs already judged" in " ".join((said.out + said.err).split())
    rc, _ = _rate_llm(tmp_path / "x", sides, "http://127.0.0.1:9/v1", "--judge_model", "m", "--judge_retries", "0")
    assert rc == 2 and "could not reach it within 60 s and 0 retries" in " ".join(capsys.readouterr().err.split())
    rc, _ = _rate_llm(tmp_path / "z", sides, srv.url, "--judge_model", "m", "--judge_timeout", "0")
    assert rc == 2 and "Expected timeout > 0" in " ".join(capsys.readouterr().err.split())
    rc, _ = _rate_llm(tmp_path / "y", sides, srv.url)
    assert rc == 2 and "--judge_model" in capsys.readouterr().err


def test_llm_judge_retries_a_failed_call_and_sends_no_key_when_there_is_none(sides, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    pair = make_pairs(*sides, a_name="A", b_name="B", seed=0)[0]
    srv = _ChatServer(fail_first=2, fail_code=503)
    try:
        reply = chat_completion_judge("judge-1", base_url=srv.url)(judge_prompt(pair))
    finally:
        srv.close()
    assert reply.startswith("Because.") and len(srv.requests) == 3  # two 503s retried, the third call answered
    assert all("authorization" not in h for h, _ in srv.requests)
    srv = _ChatServer(fail_first=1, fail_code=503)
    try:
        with pytest.raises(ValueError, match="HTTP 503"):
            chat_completion_judge("judge-1", base_url=srv.url, max_retries=0)(judge_prompt(pair))
    finally:
        srv.close()
    assert len(srv.requests) == 1


def test_llm_judge_times_out_and_says_so(sides):
    pair = make_pairs(*sides, a_name="A", b_name="B", seed=0)[0]
    srv = _ChatServer(delay=1.5)
    try:
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=r"could not reach it within 0.2 s and 1 retries"):
            chat_completion_judge("judge-1", base_url=srv.url, api_key="k", timeout=0.2, max_retries=1)(judge_prompt(pair))
        waited = time.perf_counter() - t0
    finally:
        srv.close()
    assert len(srv.requests) == 2 and waited < 1.5  # a timed-out call is retried, and neither waits for the reply


def test_polyturn_rate_serves_the_page_and_ctrl_c_prints_the_win_rate(tmp_path, sides):
    """The real command: uvicorn serves the page, a rating lands on disk, SIGINT stops it with the summary."""
    import os
    import signal
    import subprocess
    import sys

    write_jsonl(tmp_path / "a.jsonl", sides[0])
    write_jsonl(tmp_path / "b.jsonl", sides[1])
    out = tmp_path / "ratings.jsonl"
    env = dict(os.environ, COLUMNS="400")
    proc = subprocess.Popen([sys.executable, "-m", "polyturn.cli", "rate", "--pairs", str(tmp_path / "a.jsonl"),
                             str(tmp_path / "b.jsonl"), "--port", "0", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://[\d.]+:\d+/", line).group(0)
        status, page, _ = _get(url)
        assert status == 200 and "Pair 1 of 6" in page
        assert _post(url + "rate", {"pair": "0", "choice": "tie"})[0] == 303
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, line + rest
    assert "win rate 0.500" in rest and "ties 1, n 1" in rest and "Traceback" not in rest
    assert json.loads(out.read_text())["choice"] == "tie"


def test_polyturn_rate_on_a_busy_port_is_a_message(tmp_path, sides, capsys):
    import socket

    from polyturn.cli import main

    write_jsonl(tmp_path / "a.jsonl", sides[0])
    write_jsonl(tmp_path / "b.jsonl", sides[1])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        rc = main(["rate", "--pairs", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
                   "--port", str(busy.getsockname()[1]), "--out", str(tmp_path / "r.jsonl")])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "Expected a free port on 127.0.0.1" in err and "Traceback" not in err
