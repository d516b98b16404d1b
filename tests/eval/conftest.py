"""Fixtures for evaluation tests: hand-made episode records, tiny checkpoints, the MiniLM embedder."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


def make_turn(
    action: str,
    action_type: str,
    *,
    error: str | None = None,
    valid: bool | None = None,
    after: str = "ok",
    latency: float | None = 0.1,
    n_tokens: int | None = None,
    terms: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A turn spec for :func:`make_record`; ``after`` is the env's answer to the action."""
    t = {"action": action, "_after": after, "reward": sum((terms or {}).values()), "reward_terms": dict(terms or {}),
         "terminated": False, "truncated": False,
         "info": {"action_type": action_type, "action_valid": valid if valid is not None else action_type != "invalid",
                  "error": error}}
    if latency is not None:
        t["latency_s"] = latency
    if n_tokens is not None:
        t["n_tokens"] = n_tokens
    return t


def make_record(
    turns: list[dict[str, Any]],
    *,
    success: bool = False,
    question: str = "What was the total revenue of Fridge in 2022?",
    key_actions: list[str] | None = None,
    level: int = 1,
    ambiguous: bool = False,
    case_id: str = "c0",
    policy: str = "p",
    crashed: bool = False,
) -> dict[str, Any]:
    """An episode record (docs/ARCHITECTURE.md format) with observations chained from the turns' ``after``."""
    out_turns, obs = [], question
    for t in turns:
        t = dict(t, info=dict(t["info"]))
        after = t.pop("_after", "ok")
        t["observation"] = obs
        out_turns.append(t)
        obs = after
    if out_turns:
        out_turns[-1]["terminated"] = True
        out_turns[-1]["info"]["success"] = success
    return {"env_id": "polyturn/SQLAnalyst-v0", "seed": 0, "task_id": f"task-{case_id}", "policy": policy,
            "success": success, "return": sum(t["reward"] for t in out_turns), "level": level, "ambiguous": ambiguous,
            "question": question, "privileged": "", "case_id": case_id,
            "key_actions": list(key_actions if key_actions is not None else ["inspect_schema", "run_sql", "submit_answer"]),
            "turns": out_turns, "final_observation": obs, "crashed": crashed,
            "crash": "RuntimeError: boom" if crashed else None}


def expert_like(case_id: str, *, success: bool = True, ambiguous: bool = False, level: int = 1) -> dict[str, Any]:
    """A tidy successful-looking episode: schema, (ask), query, answer."""
    turns = [make_turn("Action: list_tables[{}]", "list_tables", after="Tables: sales"),
             make_turn('Action: describe_table[{"table": "sales"}]', "describe_table", after="sales (view): product TEXT")]
    if ambiguous:
        turns.append(make_turn('Action: ask_user[{"question": "Revenue or units?"}]', "ask_user", after="Revenue."))
    turns += [make_turn('Action: run_sql[{"sql": "SELECT SUM(revenue) FROM sales"}]', "run_sql", after="total\n90620"),
              make_turn('Action: submit_answer[{"answer": 90620}]', "submit_answer",
                        after="Answer submitted: " + ("correct." if success else "incorrect."))]
    keys = ["inspect_schema", *(["ask_user"] if ambiguous else []), "run_sql", "submit_answer"]
    return make_record(turns, success=success, key_actions=keys, case_id=case_id, ambiguous=ambiguous, level=level)


@pytest.fixture(scope="session")
def ep():
    """The record builders: ``ep.turn(...)``, ``ep.record(...)``, ``ep.expert_like(...)``."""
    return SimpleNamespace(turn=make_turn, record=make_record, expert_like=expert_like)


@pytest.fixture(scope="session")
def minilm():
    """The MiniLM sentence embedder (loaded once)."""
    from polyturn.eval.embed import MiniLMEmbedder

    return MiniLMEmbedder()


@pytest.fixture(scope="session")
def ckpt_run(tmp_path_factory, tiny_tokenizer) -> Path:
    """A run directory with two tiny checkpoints (different seeds), each ``actor/`` + ``config.yaml``.

    ``ckpt-b`` also has a from-scratch separate critic, for the diagnose tests.
    """
    from polyturn.config import load_config, save_config
    from polyturn.models.actor import tiny_actor
    from polyturn.models.critic import build_separate_critic
    from polyturn.models.critic_text import CRITIC_MARKERS
    from polyturn.models.tokenizer import train_tokenizer

    run = tmp_path_factory.mktemp("run")
    overrides = ["rollout.max_action_tokens=16", "rollout.num_envs=4", "env.eval_seed_start=1000",
                 'env.kwargs={"max_turns": 3}', "critic.hidden=32", "critic.layers=1"]
    for i, name in enumerate(["ckpt-a", "ckpt-b"]):
        d = run / name
        tiny_actor(tiny_tokenizer, hidden=32, layers=1, heads=4, seed=i).save_pretrained(d / "actor")
        save_config(load_config(None, overrides + [f"run.seed={i}"]), d / "config.yaml")
    critic_tok = train_tokenizer(CORPUS_CRITIC, vocab_size=400, special_tokens=CRITIC_MARKERS)
    critic = build_separate_critic(encoder="scratch", tokenizer=critic_tok, hidden=32, layers=1, heads=4, max_len=128)
    critic.save_pretrained(run / "ckpt-b" / "critic")
    (run / "latest").write_text("ckpt-b")
    return run


CORPUS_CRITIC = [
    "[TASK] What was the total revenue of Fridge in South China in 2022? [ACTION] list_tables [OBSERVATION] sales",
    "[PRIVILEGED] Intent: as stated Gold answer: 90620 [ACTION] run_sql SELECT SUM(revenue) FROM sales",
] * 20


@pytest.fixture(scope="session")
def cases_file(tmp_path_factory) -> Path:
    """Six SQL test cases with a 3-turn limit (short episodes for fast tests)."""
    path = tmp_path_factory.mktemp("cases") / "cases.json"
    cases = [{"id": f"c{s}", "env": "polyturn/SQLAnalyst-v0", "seed": s, "options": {"max_turns": 3}}
             for s in range(6)]
    path.write_text(json.dumps(cases))
    return path


# ---- numbers in report.md vs report.html ---------------------------------------------------------
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


class _BodyText(HTMLParser):
    """Visible text of the body (no head, scripts or styles); image data URIs are attributes, so excluded."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0
        self._in_body = False
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "body":
            self._in_body = True
        if tag in ("script", "style", "head", "title"):
            self._skip += 1
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head", "title"):
            self._skip -= 1

    def handle_data(self, data):
        if self._in_body and not self._skip:
            self.parts.append(data)


def html_numbers(html: str) -> tuple[list[str], list[str]]:
    p = _BodyText()
    p.feed(html)
    return NUMBER.findall(" ".join(p.parts)), p.images


def md_numbers(md: str) -> list[str]:
    md = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", md)  # image links: file names only
    md = re.sub(r"^\|(?:---\|)+$", " ", md, flags=re.M)  # table rules
    return NUMBER.findall(md)


def assert_same_numbers(md: str, html: str) -> int:
    a, _ = html_numbers(html)
    b = md_numbers(md)
    assert a == b, next(((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y), (len(a), len(b)))
    return len(a)



@pytest.fixture(scope="session")
def numbers():
    """``numbers.html(text) -> (numbers, img srcs)``, ``numbers.md(text)``, ``numbers.assert_same(md, html) -> n``."""
    return SimpleNamespace(html=html_numbers, md=md_numbers, assert_same=assert_same_numbers)
