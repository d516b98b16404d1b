"""Demonstrations: run a text policy in an env and keep the episodes as JSONL records.

One record per episode, in the format of docs/ARCHITECTURE.md ("Episode
records"); ``turns[t].observation`` is what the policy saw before writing
``turns[t].action``, and ``final_observation`` is the last observation.

A policy is any object with ``reset(obs, info)``, ``act(obs, info) -> str``
and a ``name`` (e.g. :class:`polyturn.envs.sql.expert.SQLExpert`).

This module is also the one place that makes environments for a user-given
env id (:func:`make_env`), looks up scripted experts (:data:`EXPERTS`,
:func:`make_expert`), runs a text policy for one episode (:func:`run_episode`)
and reads and writes JSONL (:func:`read_jsonl`, :func:`write_jsonl`,
:func:`append_jsonl`).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import gymnasium

import polyturn.envs  # noqa: F401  (registers the env ids)
from polyturn.envs.actions import ToolCall, format_action, parse_action
from polyturn.envs.customer_service.expert import CustomerServiceExpert
from polyturn.envs.negotiation.expert import NegotiationExpert
from polyturn.envs.sql.expert import NoiseConfig, SQLExpert
from polyturn.envs.twenty_questions.expert import TwentyQuestionsExpert
from polyturn.rollout.types import EVAL_TURN_INFO_KEYS, TURN_INFO_KEYS

# env id -> scripted expert class, constructed as cls(env, noise=..., seed=...)
EXPERTS: dict[str, type] = {"polyturn/SQLAnalyst-v0": SQLExpert, "polyturn/CustomerService-v0": CustomerServiceExpert,
                            "polyturn/TwentyQuestions-v0": TwentyQuestionsExpert, "polyturn/Negotiation-v0": NegotiationExpert}


class TextPolicy(Protocol):
    """What :func:`run_episode` needs from a policy."""

    name: str

    def reset(self, obs: str, info: Mapping[str, Any]) -> None:
        """Start an episode from the first observation and its info."""

    def act(self, obs: str, info: Mapping[str, Any]) -> str:
        """The next action text."""


def registered_env_ids() -> list[str]:
    """The polyturn env ids registered with gymnasium."""
    return sorted(k for k in gymnasium.registry if k.startswith("polyturn/"))


def make_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> gymnasium.Env:
    """``gymnasium.make(env_id, **env_kwargs)`` without the env checker; a bad id or kwarg raises ``ValueError``.

    The message names the registered ids, or the keyword the environment rejected.
    """
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise ValueError(f"Expected env kwargs as a JSON object (e.g. {{\"max_turns\": 6}}), "
                         f"got {type(env_kwargs).__name__} {env_kwargs!r}")
    kwargs = dict(env_kwargs or {})
    try:
        return gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    except gymnasium.error.Error as e:
        raise ValueError(f"Expected a registered env id (known: {registered_env_ids()}), got {env_id!r} ({e})") from None
    except TypeError as e:  # the env's constructor rejected a keyword
        reason = str(e).split(" was raised from the environment creator")[0]  # gymnasium appends the kwargs
        raise ValueError(f"Expected env kwargs that {env_id} accepts, got {kwargs} ({reason})") from None


def make_expert(env: gymnasium.Env, *, noise: float | NoiseConfig = 0.0, seed: int = 0) -> TextPolicy:
    """The scripted expert of ``env`` (looked up in :data:`EXPERTS` by its env id)."""
    env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    if env_id not in EXPERTS:
        raise ValueError(f"Expected an env id with a scripted expert ({sorted(EXPERTS)}), got {env_id!r}; "
                         "add its expert class to polyturn.demos.EXPERTS")
    return EXPERTS[env_id](env, noise=noise, seed=seed)


def episode_head(*, env_id: str, seed: int | None, policy: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """An episode record as reset leaves it: the task's fields, no turns, no success yet."""
    return {
        "env_id": env_id,
        "seed": seed,
        "task_id": str(info.get("task_id", "")),
        "policy": policy,
        "success": False,
        "return": 0.0,
        "level": int(info.get("level", 0) or 0),
        "ambiguous": bool(info.get("ambiguous", False)),
        "question": str(info.get("question", "")),
        "privileged": str(info.get("privileged", "")),
        "key_actions": list(info.get("key_actions", [])),
        "turns": [],
        "final_observation": "",
    }


def exception_text(error: BaseException) -> str:
    """``"ValueError: message"`` (no traceback), as an evaluation record's ``crash`` keeps it."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()


def run_episode(
    env: gymnasium.Env,
    policy: TextPolicy,
    *,
    seed: int | None,
    options: Mapping[str, Any] | None = None,
    label: str | None = None,
    for_eval: bool = False,
) -> dict[str, Any]:
    """Play one episode with ``policy`` from ``env.reset(seed=seed, options=options)`` and return its record.

    Args:
        env: the environment (a gymnasium env; its spec names the record's ``env_id``).
        policy: a :class:`TextPolicy`.
        seed: the task seed.
        options: reset options (task id, level, turn limit ...).
        label: the record's ``policy`` (default ``policy.name``).
        for_eval: write an evaluation record (:mod:`polyturn.eval.records`): per turn ``latency_s``
            (``act`` plus ``step``) and ``forced`` (always False), turn info as actor rollouts keep
            it, and an exception ends the episode as ``crashed`` (its text in ``crash``) instead of
            propagating. Demonstrations leave it False.
    """
    env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    name = label if label is not None else policy.name
    info: dict[str, Any] = {}
    try:
        obs, info = env.reset(seed=seed, options=dict(options) if options else None)
    except Exception as e:  # noqa: BLE001  (in evaluation a crash is a result to report)
        if not for_eval:
            raise
        return episode_head(env_id=env_id, seed=seed, policy=name, info={}) | {"crashed": True,
                                                                               "crash": exception_text(e)}
    record = episode_head(env_id=env_id, seed=seed, policy=name, info=info)
    if for_eval:
        record |= {"crashed": False, "crash": None}
    keys = EVAL_TURN_INFO_KEYS if for_eval else TURN_INFO_KEYS
    total = 0.0
    try:
        policy.reset(obs, info)
        while True:
            t0 = time.perf_counter()
            action = policy.act(obs, info)
            next_obs, reward, terminated, truncated, info = env.step(action)
            latency = time.perf_counter() - t0
            total += float(reward)
            turn: dict[str, Any] = {"observation": obs, "action": action, "reward": float(reward),
                                    "reward_terms": dict(info["reward_terms"]), "terminated": bool(terminated),
                                    "truncated": bool(truncated)}
            if for_eval:
                turn |= {"latency_s": latency, "forced": False}
            turn["info"] = {k: (dict(info[k]) if k == "features" else info[k]) for k in keys if k in info}
            record["turns"].append(turn)
            obs = next_obs
            if terminated or truncated:
                record["success"] = bool(info.get("success", False))
                record["final_observation"] = obs
                break
    except Exception as e:  # noqa: BLE001
        if not for_eval:
            raise
        record.update(crashed=True, crash=exception_text(e))
    record["return"] = total
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
    if episodes < 0:
        raise ValueError(f"Expected episodes >= 0, got {episodes}")
    env = make_env(env_id, env_kwargs)
    try:
        policy = make_expert(env, noise=noise, seed=seed)
        for i in range(episodes):
            yield run_episode(env, policy, seed=seed + i)
            if progress is not None:
                progress(1)
    finally:
        env.close()


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> int:
    """Write records one JSON object a line (UTF-8, Chinese kept readable); returns how many."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"Expected a file path to write JSONL to, got the directory {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def append_jsonl(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one record as a JSON line (creating the file and its directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL file; a missing file raises ``FileNotFoundError``, a bad line ``ValueError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Expected a JSONL file at {path}, found {'a directory' if path.is_dir() else 'none'}")
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines(): JSON text may hold U+2028
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: Expected a UTF-8 JSONL file, got bytes that are not UTF-8 ({e.reason})") from None
    records = []
    for lineno, line in enumerate(lines, start=1):
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
