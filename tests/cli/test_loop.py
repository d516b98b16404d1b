"""The loop of docs/offline.md, end to end on a tiny checkpoint: serve the BC policy with --record, play sessions
with the env's simulated user, judge them, train offline, evaluate offline, ramp behind the off-policy gate.

The commands are the doc's, word for word (``test_the_doc_shows_the_tested_loop``), run in order on each other's
files: both servers are ``polyturn serve`` subprocesses on free ports, the other commands go through
:func:`polyturn.cli.main` in this process (the same argument parsing, without a fresh interpreter's imports), and
the ``curl`` lines are sent with httpx as curl would send them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from polyturn.acting.jsonl import read_jsonl
from polyturn.cli import main
from tests.serve.conftest import fixed_reply_checkpoint, free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "offline.md"

LOOP = [
    "polyturn train --config configs/loop_tiny.yaml --set run.out_dir=runs/loop/bc",
    "export POLYTURN_ADMIN_TOKEN=$(openssl rand -hex 16)",
    "polyturn serve --checkpoint runs/loop/bc/ckpt-bc --checkpoint-dir runs/loop --record runs/loop/served "
    "--ope-margin 0.05 --ope-metric return --ope-min-sessions 10 --port 8000 &",
    "polyturn serve --checkpoint runs/judge/ckpt-final --port 8001 &",
    "polyturn play --server http://127.0.0.1:8000 --episodes 16 --temperature 1 --quiet",
    "polyturn play --server http://127.0.0.1:8000 --episodes 8 --seed 16 --max-turns 2 --temperature 1 --quiet",
    "polyturn judge --data runs/loop/served/sessions.jsonl --endpoint http://127.0.0.1:8001/v1 --model ckpt-final "
    "--out runs/loop/judged.jsonl",
    "polyturn train --config configs/loop_tiny.yaml --offline runs/loop/judged.jsonl "
    "--set actor.init_from=runs/loop/bc/ckpt-bc --set run.out_dir=runs/loop/offline",
    "polyturn evaluate --offline runs/loop/served --policy runs/loop/offline/ckpt-final --out runs/loop/ope",
    'H="Authorization: Bearer $POLYTURN_ADMIN_TOKEN"; J="Content-Type: application/json"',
    """curl -H "$H" -H "$J" -d '{"checkpoint": "runs/loop/offline/ckpt-final", "name": "offline"}' """
    "http://127.0.0.1:8000/admin/versions",
    """curl -H "$H" -H "$J" -d '{"version": "offline", "dwell_s": 0, "min_samples": 0}' """
    "http://127.0.0.1:8000/admin/routing/ramp",
    'curl -H "$H" http://127.0.0.1:8000/admin/routing',
]


def doc_loop() -> list[str]:
    """The commands of the code block under docs/offline.md's "## The loop": comments dropped, lines joined."""
    section = DOC.read_text().split("\n## The loop\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    lines = [line for line in block.replace("\\\n", " ").splitlines() if not line.startswith("#")]
    return [re.sub(r"\s+", " ", line).strip() for line in lines if line.strip()]


def test_the_doc_shows_the_tested_loop():
    assert doc_loop() == LOOP


class Shell:
    """Runs the loop's lines in a directory: variables, ``polyturn`` commands, background servers, ``curl``."""

    def __init__(self, cwd: Path, ports: dict[str, int]) -> None:
        self.cwd, self.ports = cwd, ports
        self.vars: dict[str, str] = {}
        self.servers: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def _line(self, line: str) -> str:
        for doc_port, port in self.ports.items():
            line = line.replace(f"127.0.0.1:{doc_port}", f"127.0.0.1:{port}").replace(f"--port {doc_port}",
                                                                                     f"--port {port}")
        return line

    def _expand(self, word: str) -> str:
        return re.sub(r"\$(\w+)", lambda m: self.vars[m.group(1)], word)

    def run(self, line: str, capsys) -> str:
        """Run one line; returns what a ``polyturn`` command printed (stdout and stderr), or the response body."""
        line = self._line(line)
        if line == "export POLYTURN_ADMIN_TOKEN=$(openssl rand -hex 16)":
            self.vars["POLYTURN_ADMIN_TOKEN"] = secrets.token_hex(16)
            return ""
        if re.fullmatch(r'(\w+="[^"]*"(; )?)+', line):
            for name, value in re.findall(r'(\w+)="([^"]*)"', line):
                self.vars[name] = self._expand(value)
            return ""
        words = [self._expand(w) for w in shlex.split(line)]
        if words[0] == "curl":
            return self._curl(words[1:])
        assert words[0] == "polyturn", line
        if words[-1] == "&":
            self._serve(words[1:-1])
            return ""
        capsys.readouterr()
        assert main(words[1:]) == 0, capsys.readouterr()
        out = capsys.readouterr()
        return out.out + out.err

    def _serve(self, argv: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **self.vars}
        log = self.cwd / f"serve{len(self.servers)}.log"
        with log.open("w") as f:  # a file, not a pipe: uvicorn logs every request, and a full pipe would block it
            self.servers.append(subprocess.Popen([sys.executable, "-m", "polyturn.cli", *argv], cwd=self.cwd,
                                                 env=env, stdout=f, stderr=subprocess.STDOUT))
        self.logs.append(log)

    def wait_for_servers(self) -> None:
        deadline = time.time() + 120
        for proc, log, port in zip(self.servers, self.logs, self.ports.values(), strict=True):
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.time() < deadline, f"server on port {port} did not start"
                time.sleep(0.2)

    @staticmethod
    def _curl(args: list[str]) -> str:
        headers, data, url = {}, None, None
        it = iter(args)
        for a in it:
            if a == "-H":
                k, v = next(it).split(":", 1)
                headers[k.strip()] = v.strip()
            elif a == "-d":
                data = next(it)
            else:
                url = a
        r = httpx.request("POST" if data is not None else "GET", url, content=data, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        return r.text

    def close(self) -> None:
        for proc in self.servers:
            proc.terminate()
        for proc in self.servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.slow
def test_the_loop_end_to_end(tmp_path, monkeypatch, capsys, tiny_tokenizer):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    fixed_reply_checkpoint(tmp_path / "runs" / "judge", tiny_tokenizer, name="ckpt-final", reply="Score: 7")
    monkeypatch.chdir(tmp_path)
    sh = Shell(tmp_path, {"8000": free_port(), "8001": free_port()})
    (bc, token, serve, serve_judge, play, play_leaving, judge, train, evaluate, headers, load, ramp, routing) = LOOP
    try:
        # 0. The BC policy.
        sh.run(bc, capsys)
        assert (tmp_path / "runs/loop/bc/ckpt-bc/actor").is_dir()
        # 1. The policy served with --record and the gate, and the judge.
        for line in (token, serve, serve_judge):
            sh.run(line, capsys)
        sh.wait_for_servers()
        # 2. Sessions with the env's simulated user, recorded with their behaviour log-probs at temperature 1.
        said = " ".join(sh.run(play, capsys).split())
        assert "played 16 episodes" in said and "(ckpt-bc 16)" in said and "the server recorded 16" in said
        said = " ".join(sh.run(play_leaving, capsys).split())
        assert "played 8 episodes" in said and "2.0 turns per episode, 8 left unfinished (no outcome)" in said
        served = list(read_jsonl(tmp_path / "runs/loop/served/sessions.jsonl"))
        assert len(served) == 24 and {r["policy_version"] for r in served} == {"ckpt-bc"}
        assert sorted(r["seed"] for r in served) == list(range(24))
        assert all(r["temperature"] == 1.0 and r["turns"] and len(r["turns"]) <= 4 for r in served)
        assert all(len(t["logprobs"]) == len(t["action_ids"]) > 0 for r in served for t in r["turns"])
        left = [r for r in served if not (r["turns"][-1]["terminated"] or r["turns"][-1]["truncated"])]
        assert sorted(r["seed"] for r in left) == list(range(16, 24)) and all(len(r["turns"]) == 2 for r in left)
        # 3. Judged by the other server.
        said = " ".join(sh.run(judge, capsys).split())
        assert "judged 24 episodes (0 from" in said and "24 sent" in said
        judged = list(read_jsonl(tmp_path / "runs/loop/judged.jsonl"))
        assert [r["judge_score"] for r in judged] == [7] * 24 and all(r["judge_model"] == "ckpt-final" for r in judged)
        # 4. Offline RL from the served policy on its judged sessions, their recorded token ids as they are; the
        #    judge's score is the return of the sessions left unfinished.
        said = " ".join(sh.run(train, capsys).split())
        assert "offline data: 24 episodes of polyturn/SQLAnalyst-v0 from 1 file(s)" in said
        assert "ckpt-bc / ckpt-bc: 24 episodes" in said
        assert "judge: 24 episodes scored, 8 without a known outcome end with the term judge/score" in said
        assert "24 of 24 episodes keep their recorded action ids" in said
        assert (tmp_path / "runs/loop/offline/ckpt-final/actor").is_dir()
        # 5. The new checkpoint estimated on the served sessions.
        said = " ".join(sh.run(evaluate, capsys).split())
        assert "ckpt-final on 24 recorded episodes" in said and "behaviour ckpt-bc: 24" in said
        report = json.loads((tmp_path / "runs/loop/ope/offline_eval.json").read_text())
        assert report["episodes"] == 24 and report["ess"] > 0
        # 6. Loaded into the running server and ramped: the gate decides at 20% and says why.
        sh.run(headers, capsys)
        assert json.loads(sh.run(load, capsys))["id"] == "offline"
        assert json.loads(sh.run(ramp, capsys))["ramp"]["arm"] == "offline"
        deadline = time.time() + 120
        while (state := json.loads(sh.run(routing, capsys)))["ramp"]["status"] == "running":
            assert time.time() < deadline, state["ramp"]
            time.sleep(0.2)
    finally:
        sh.close()
    gate, events = state["ramp"]["gate"], [e["event"] for e in state["events"]]
    assert gate["sessions"] == 24 and gate["metric"] == "return" and gate["margin"] == 0.05
    assert events[:3] == ["ramp_start", "ramp_stage", "ope_gate_start"]
    if gate["status"] == "passed":
        assert state["ramp"]["status"] == "done" and state["shares"]["offline"] == 1.0
        assert "is at or above ckpt-bc's" in gate["message"] and "ope_gate_passed" in events
    else:
        assert state["ramp"]["status"] == "stopped" and state["shares"]["offline"] == 0.0
        assert state["ramp"]["reason"].startswith("refused past 20%: offline's off-policy return lower bound")
        assert "below ckpt-bc's" in state["ramp"]["reason"] and "ope_gate_failed" in events
    # The gate's estimate is step 5's, on the same sessions.
    assert gate["estimate"] == pytest.approx(report["wis"]["return"]["value"])
