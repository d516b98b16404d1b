"""Live sessions: conversation and tool state, idle timeouts, heartbeats, reset and close.

A session belongs to one version (its A/B arm, chosen once) and leases one
cache row of that version's engine for its whole life. It expires after
``timeout_s`` without a request or heartbeat; expiry, close and reset all clear
its state (cache row restarted, environment closed) and hand the finished
conversation to the recorder. Ids are random 128-bit tokens: an unknown or
expired id is a 404, never another session's state.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from polyturn.serve.conversation import ChatState
from polyturn.serve.engine import Slot


class SessionNotFound(KeyError):
    """An unknown, closed or expired session id (HTTP 404)."""


@dataclass(eq=False)
class Session:
    """One live conversation (``kind`` ``env``: the server runs an environment's tools; ``chat``: plain)."""

    id: str
    kind: str
    arm: str
    slot: Slot
    state: ChatState
    temperature: float
    env: Any = None
    env_id: str = "chat"
    seed: int | None = None
    #: Seeds the agent's sampling: its k-th turn draws with seed ``sample_seed + k`` (``--engine vllm``).
    sample_seed: int | None = None
    task: dict[str, Any] = field(default_factory=dict)
    obs: str = ""
    features: dict[str, float] = field(default_factory=dict)
    turns: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    success: bool | None = None
    final_observation: str = ""
    feedback: list[dict[str, Any]] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: A hierarchical version's session: its manager and chat game (:class:`polyturn.serve.hierarchy.SessionHierarchy`);
    #: the game's record (subgoals, manager turns) is ``task["hierarchy"]``.
    hier: Any = None

    def touch(self) -> None:
        """A request or heartbeat: the idle timer starts again."""
        self.last_seen = time.monotonic()

    def public(self, timeout_s: float) -> dict[str, Any]:
        """What ``GET /v1/sessions/{id}`` shows."""
        return {"id": self.id, "object": "session", "kind": self.kind, "model": self.arm, "env": self.env_id,
                "task_id": self.task.get("task_id"), "question": self.task.get("question"),
                "level": self.task.get("level"),
                "turns": len(self.turns), "done": self.done, "success": self.success,
                "expires_in_s": round(max(0.0, timeout_s - (time.monotonic() - self.last_seen)), 3),
                "messages": [{"role": k, "content": t} for k, t in self.state.items],
                **({"hierarchy": self.hierarchy()} if self.hier is not None else {})}

    def hierarchy(self) -> dict[str, Any]:
        """A hierarchical session's subgoals: the one in force (None before the first), every one set so far
        (name, text, worker turns, why it ended, reached), and how many turns the manager took."""
        game = self.task.get("hierarchy") or {"subgoals": [], "manager_turns": []}
        return {"subgoal": game["subgoals"][-1] if game["subgoals"] else None, "subgoals": game["subgoals"],
                "manager_turns": len(game["manager_turns"])}

    def to_record(self, *, end_reason: str) -> dict[str, Any]:
        """The episode record of this conversation (the ``polyturn demos`` format plus serving fields)."""
        outcome = next((f["outcome"] for f in reversed(self.feedback) if f.get("outcome")), None)
        success = self.success if self.success is not None else outcome == "success"
        t = self.task
        return {
            "env_id": self.env_id, "seed": self.seed, "task_id": t.get("task_id", f"session-{self.id[:8]}"),
            "policy": self.arm, "policy_version": self.arm, "success": bool(success),
            "return": float(sum(x["reward"] for x in self.turns)), "level": int(t.get("level", 0)),
            "ambiguous": bool(t.get("ambiguous", False)), "question": t.get("question", ""),
            "privileged": t.get("privileged", ""), "key_actions": list(t.get("key_actions", [])),
            "turns": self.turns, "final_observation": self.final_observation,
            "session_id": self.id, "kind": self.kind, "end_reason": end_reason, "feedback": self.feedback,
            "temperature": self.temperature, "sample_seed": self.sample_seed, "started_at": self.created, "ended_at": time.time(),
            **({"role": "worker", "hierarchy": t["hierarchy"]} if t.get("hierarchy") is not None else {}),
        }


class SessionStore:
    """Sessions by id, with the idle timeout (thread-safe)."""

    def __init__(self, *, timeout_s: float = 300.0, max_sessions: int = 256) -> None:
        if timeout_s <= 0:
            raise ValueError(f"Expected a session timeout > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @staticmethod
    def new_id() -> str:
        """An unguessable session id."""
        return "sess_" + secrets.token_urlsafe(16)

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, session: Session) -> None:
        """Keep a new session."""
        with self._lock:
            self._sessions[session.id] = session

    def get(self, session_id: str) -> Session:
        """The live session ``session_id``; :class:`SessionNotFound` if unknown or idle past the timeout."""
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None or time.monotonic() - s.last_seen > self.timeout_s:
            raise SessionNotFound(f"Expected a live session id, got {session_id!r}: unknown, closed or expired "
                                  f"(sessions expire after {self.timeout_s:g} s without a request or heartbeat); "
                                  "open a new one with POST /v1/sessions")
        return s

    def pop(self, session_id: str) -> Session | None:
        """Remove and return a session (None if already gone)."""
        with self._lock:
            return self._sessions.pop(session_id, None)

    def expired(self) -> list[Session]:
        """Remove and return the sessions idle past the timeout."""
        now = time.monotonic()
        with self._lock:
            gone = [s for s in self._sessions.values() if now - s.last_seen > self.timeout_s and not s.lock.locked()]
            for s in gone:
                del self._sessions[s.id]
        return gone

    def all(self) -> list[Session]:
        """Every live session."""
        with self._lock:
            return list(self._sessions.values())
