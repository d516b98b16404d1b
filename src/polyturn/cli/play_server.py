"""``polyturn play --server URL``: episodes played by a running ``polyturn serve`` in its environment sessions.

The server holds each session's environment, so the environment's own simulated user (or scripted partner)
answers the served agent, as in production; a server started with ``--record DIR`` writes every finished
session to ``DIR/sessions.jsonl`` with the sampled token ids and log-probs (the data of ``polyturn judge``,
``polyturn train --offline`` and ``polyturn evaluate --offline``, docs/offline.md "The loop"). ``--concurrency``
sessions run at once, so the server's batched engine decodes them together; each plays its task to the end
(``POST /v1/sessions/{id}/turns`` until the episode is done), then is closed (``DELETE``), which records it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections.abc import Sequence
from typing import Any

import httpx
from rich.console import Console

from polyturn.acting.episodes import format_transcript

#: Agent turns one request asks for; the environment's own turn limit ends every episode.
STEPS_PER_REQUEST = 64


def _error(r: httpx.Response) -> str:
    """The server's message (its errors have the OpenAI shape ``{"error": {"message": ...}}``), else the body."""
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


async def _call(c: httpx.AsyncClient, method: str, path: str, **kw: Any) -> dict:
    try:
        r = await c.request(method, path, **kw)
    except httpx.HTTPError as e:
        raise ValueError(f"Expected a polyturn serve at {c.base_url}, got no answer to {method} {path} "
                         f"({type(e).__name__}: {e})") from None
    if r.status_code >= 400:
        raise ValueError(f"{method} {path} on {c.base_url}: HTTP {r.status_code}: {_error(r)}")
    return r.json()


async def play_episode(c: httpx.AsyncClient, *, session: dict[str, Any],
                       max_turns: int | None = None) -> dict[str, Any]:
    """Open an environment session with ``session`` (the ``POST /v1/sessions`` body), play it to its end (or to
    ``max_turns`` agent turns: a user who leaves), close it; returns its episode in the record format (the turns as
    the server answered them) plus ``recorded``."""
    s = await _call(c, "POST", "/v1/sessions", json=session)
    turns: list[dict] = []
    observation = s.get("question") or ""
    try:
        while True:
            steps = STEPS_PER_REQUEST if max_turns is None else min(STEPS_PER_REQUEST, max_turns - len(turns))
            out = await _call(c, "POST", f"/v1/sessions/{s['id']}/turns", json={"max_steps": steps})
            for t in out["turns"]:
                turns.append({"observation": observation, "action": t["action"], "reward": t["reward"],
                              "reward_terms": {}, "terminated": t["terminated"], "truncated": t["truncated"],
                              "info": {"action_type": t["tool"], "error": t["error"]}})
                observation = t["observation"]
            state = out["session"]
            if state["done"] or (max_turns is not None and len(turns) >= max_turns):
                break
            if not out["turns"]:
                raise ValueError(f"Expected turns from session {s['id']} on {c.base_url}, got none before its end")
    except Exception:  # close it rather than leave it to the server's idle timeout; the error is what matters
        with contextlib.suppress(httpx.HTTPError):
            await c.delete(f"/v1/sessions/{s['id']}")
        raise
    closed = await _call(c, "DELETE", f"/v1/sessions/{s['id']}")
    return {"env_id": session["env"], "seed": session["seed"], "task_id": state["task_id"], "level": state["level"],
            "policy": state["model"], "policy_version": state["model"], "success": bool(state["success"]),
            "done": bool(state["done"]),
            "return": sum(t["reward"] for t in turns), "question": state["question"], "turns": turns,
            "final_observation": observation, "session_id": s["id"], "recorded": bool(closed["recorded"])}


async def play_on_server(url: str, *, sessions: Sequence[dict[str, Any]], concurrency: int,
                         max_turns: int | None = None, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Play every session body in ``sessions`` to its end (or ``max_turns``), ``concurrency`` at a time; their
    episodes in order."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as c:
        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with gate:
                return await play_episode(c, session=body, max_turns=max_turns)

        return list(await asyncio.gather(*(one(b) for b in sessions)))


def default_env(url: str) -> str:
    """The server's default environment (its first version's training env), from ``GET /v1/envs``."""
    async def get() -> dict:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            return await _call(c, "GET", "/v1/envs")

    env = asyncio.run(get())["default"]
    if not env:
        raise ValueError(f"Expected a server with a loaded version at {url}, got none: name the env with --env")
    return env


def summary(url: str, episodes: Sequence[dict[str, Any]], *, temperature: float) -> str:
    """One line: how many episodes each version played, success, return, turns, and what the server recorded."""
    versions: dict[str, int] = {}
    for e in episodes:
        versions[e["policy"]] = versions.get(e["policy"], 0) + 1
    by = ", ".join(f"{v} {n}" for v, n in versions.items())
    recorded = sum(e["recorded"] for e in episodes)
    left = sum(not e["done"] for e in episodes)
    unfinished = f", {left} left unfinished (no outcome)" if left else ""
    saved = (f"the server recorded {recorded} (its --record DIR/sessions.jsonl)" if recorded
             else "the server recorded none (start it with --record DIR to keep them)")
    if recorded and temperature == 0:
        saved += ("; greedy (--temperature 0): `polyturn evaluate --offline` and the ramp's gate cannot weigh "
                  "these sessions, sample them (--temperature 1) for that")
    return (f"played {len(episodes)} episodes on {url} ({by}): success rate "
            f"{statistics.mean(e['success'] for e in episodes):.3f}, mean return "
            f"{statistics.mean(e['return'] for e in episodes):.2f}, "
            f"{statistics.mean(len(e['turns']) for e in episodes):.1f} turns per episode{unfinished}; {saved}")


def run(args: argparse.Namespace) -> int:
    """``polyturn play --server URL``: ``--episodes`` tasks (seeds ``--seed`` on) played by the server's agent."""
    if args.policy is not None or args.env_kwargs is not None:
        raise ValueError("Expected no --policy or --env-kwargs with --server: the server plays its loaded versions "
                         "(choose one with --model) in environments made with their checkpoints' env kwargs")
    url = args.server.rstrip("/")
    env_id = args.env or default_env(url)
    base = {"env": env_id, "model": args.model, "temperature": args.temperature, "files": args.files,
            "role": args.role, "partner": args.partner}
    bodies = [{**{k: v for k, v in base.items() if v is not None}, "seed": args.seed + k}
              for k in range(args.episodes)]
    episodes = asyncio.run(play_on_server(url, sessions=bodies, concurrency=args.concurrency,
                                          max_turns=args.max_turns))
    out = Console()
    if not args.quiet:
        for e in episodes:
            out.print(format_transcript(e), highlight=False)
    out.print(summary(url, episodes, temperature=args.temperature), highlight=False)
    return 0
