"""Demonstrations: run a text policy in an env and keep the episodes as JSONL records.

One record per episode, in the format of docs/ARCHITECTURE.md ("Episode
records"); ``turns[t].observation`` is what the policy saw before writing
``turns[t].action``, and ``final_observation`` is the last observation.

A policy is any object with ``reset(obs, info)``, ``act(obs, info) -> str``
and a ``name`` (e.g. :class:`polyturn.envs.sql.expert.SQLExpert`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import gymnasium

import polyturn.envs  # noqa: F401  (registers the env ids)
from polyturn.envs.actions import ToolCall, format_action, parse_action
from polyturn.envs.customer_service.expert import CustomerServiceExpert
from polyturn.envs.sql.expert import NoiseConfig, SQLExpert

# env id -> scripted expert class, constructed as cls(env, noise=..., seed=...)
EXPERTS: dict[str, type] = {"polyturn/SQLAnalyst-v0": SQLExpert, "polyturn/CustomerService-v0": CustomerServiceExpert}


class TextPolicy(Protocol):
    """What :func:`run_episode` needs from a policy."""

    name: str

    def reset(self, obs: str, info: Mapping[str, Any]) -> None:
        """Start an episode from the first observation and its info."""

    def act(self, obs: str, info: Mapping[str, Any]) -> str:
        """The next action text."""


def run_episode(env: gymnasium.Env, policy: TextPolicy, *, seed: int) -> dict[str, Any]:
    """Play one episode with ``policy`` from ``env.reset(seed=seed)`` and return its record."""
    obs, info = env.reset(seed=seed)
    policy.reset(obs, info)
    record: dict[str, Any] = {
        "env_id": env.spec.id if env.spec is not None else type(env.unwrapped).__name__,
        "seed": seed,
        "task_id": info["task_id"],
        "policy": policy.name,
        "success": False,
        "return": 0.0,
        "level": info["level"],
        "ambiguous": info["ambiguous"],
        "question": info["question"],
        "privileged": info["privileged"],
        "key_actions": list(info["key_actions"]),
        "turns": [],
        "final_observation": "",
    }
    total = 0.0
    while True:
        action = policy.act(obs, info)
        next_obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        record["turns"].append(
            {
                "observation": obs,
                "action": action,
                "reward": reward,
                "reward_terms": dict(info["reward_terms"]),
                "terminated": terminated,
                "truncated": truncated,
                "info": {
                    "action_type": info["action_type"],
                    "action_valid": info["action_valid"],
                    "error": info["error"],
                    "features": dict(info["features"]),
                    "privileged": info["privileged"],
                },
            }
        )
        obs = next_obs
        if terminated or truncated:
            break
    record["success"] = bool(info["success"])
    record["return"] = total
    record["final_observation"] = obs
    return record


def generate_demos(
    env_id: str,
    *,
    episodes: int,
    noise: float | NoiseConfig,
    seed: int,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield ``episodes`` records of the env's scripted expert; episode ``i`` uses seed ``seed + i``.

    ``progress(1)`` is called after each episode (the CLI turns it into a progress bar).
    """
    if env_id not in EXPERTS:
        raise ValueError(f"Expected an env id with a scripted expert ({sorted(EXPERTS)}), got {env_id!r}")
    if episodes < 0:
        raise ValueError(f"Expected episodes >= 0, got {episodes}")
    env = gymnasium.make(env_id, **dict(env_kwargs or {}))
    policy = EXPERTS[env_id](env, noise=noise, seed=seed)
    try:
        for i in range(episodes):
            yield run_episode(env, policy, seed=seed + i)
            if progress is not None:
                progress(1)
    finally:
        env.close()


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> int:
    """Write records one JSON object a line (UTF-8, Chinese kept readable); returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL file; a bad line raises ``ValueError`` naming the file and line number."""
    records = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: Expected a JSON object, got invalid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: Expected a JSON object, got {type(record).__name__}")
            records.append(record)
    return records


def _indent(label: str, text: str) -> str:
    lines = text.splitlines() or [""]
    pad = " " * (len(label) + 2)
    return f"{label}: {lines[0]}" + "".join(f"\n{pad}{line}" for line in lines[1:])


def format_transcript(record: Mapping[str, Any]) -> str:
    """A readable transcript: USER / THOUGHT / ACTION / OBSERVATION lines and each turn's reward."""
    flags = f"level {record.get('level')}" + (", ambiguous" if record.get("ambiguous") else "")
    out = [f"=== {record.get('task_id')} ({flags}) policy={record.get('policy')} seed={record.get('seed')}"]
    turns = record.get("turns", [])
    if turns:
        out.append(_indent("USER", turns[0]["observation"]))
    for t, turn in enumerate(turns):
        parsed = parse_action(turn["action"])
        if isinstance(parsed, ToolCall):
            if parsed.thought:
                out.append(_indent("THOUGHT", parsed.thought))
            out.append(_indent("ACTION", format_action(parsed.tool, parsed.args).removeprefix("Action: ")))
        else:
            out.append(_indent("ACTION", turn["action"].strip() or "(empty)"))
        after = turns[t + 1]["observation"] if t + 1 < len(turns) else record.get("final_observation", "")
        label = "USER" if turn["info"]["action_type"] == "ask_user" else "OBSERVATION"
        out.append(_indent(label, after))
        paid = ", ".join(f"{k} {v:+.2f}" for k, v in turn["reward_terms"].items() if v)
        out.append(f"  reward {turn['reward']:+.2f} ({paid})")
    verdict = "success" if record.get("success") else "failure"
    out.append(f"=== {verdict}, return {record.get('return', 0.0):+.2f}")
    return "\n".join(out)
