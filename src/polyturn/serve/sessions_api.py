"""Session endpoints: open, read, turn, heartbeat, reset, feedback, close.

``POST /v1/sessions`` with ``env`` opens an environment-backed session: the
server starts the environment's task (``seed``, ``task_id``, ``level``; a
``database`` / ``tasks`` file from the server's data directory) and runs its
tools for the agent on each ``POST /v1/sessions/{id}/turns``. Without ``env``
it is a plain chat session: each turn takes the user's ``message``.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from polyturn.acting.registry import env_ids
from polyturn.serve.conversation import RequestError
from polyturn.serve.service import Service

router = APIRouter()


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionCreate(_Body):
    """``POST /v1/sessions``."""

    env: str | None = Field(None, max_length=100, description="An environment id; none for a plain chat session.")
    model: str | None = Field(None, max_length=200, description="A loaded version, or none/auto to be routed.")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="The environment's task seed.")
    sample_seed: int | None = Field(None, ge=0, le=2**31 - 1, description=(
        "Seeds the agent's sampling: its k-th turn draws with seed sample_seed + k, so a session with the same "
        "task, temperature and sample_seed plays the same tokens again (honoured by --engine vllm; the home "
        "engine draws a batch from one generator and ignores it)."))
    task_id: str | None = Field(None, max_length=200)
    level: int | None = Field(None, ge=1, le=5)
    files: dict[str, str] | None = Field(None, max_length=8, description=(
        "Files in the server's --data-dir for the environment, by the kinds its spec opens "
        "(EnvSpec.data_files), e.g. {\"database\": \"shop.db\"} for the SQL analyst."))
    role: str | None = Field(None, max_length=64, description=(
        "A multi-role environment (e.g. Negotiation-v0 with opponent: self): the seat the agent plays (default: "
        "the first role); the others are played by the env's scripted training partners."))
    partner: str | None = Field(None, max_length=64, description=(
        "A multi-role environment: the scripted partner in the other seats, by name (default: the first of the "
        "env spec's partners)."))
    database: str | None = Field(None, max_length=255, description="Short for files={\"database\": ...}.")
    tasks: str | None = Field(None, max_length=255, description="Short for files={\"tasks\": ...}.")

    def data_files(self) -> dict[str, str]:
        """``files`` with the ``database`` / ``tasks`` shorthands merged in."""
        out = dict(self.files or {})
        out |= {k: v for k, v in (("database", self.database), ("tasks", self.tasks)) if v is not None}
        for kind, name in out.items():
            if len(kind) > 64 or len(name) > 255:
                raise RequestError("Expected files as {kind: file name} with short names, got a longer one")
        return out


class TurnBody(_Body):
    """``POST /v1/sessions/{id}/turns``."""

    message: str | None = Field(None, min_length=1, description="The user's message (chat sessions).")
    max_steps: int = Field(1, ge=1, le=64, description="Agent turns to run (environment sessions).")


class ResetBody(_Body):
    """``POST /v1/sessions/{id}/reset``."""

    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    task_id: str | None = Field(None, max_length=200)
    level: int | None = Field(None, ge=1, le=5)


class FeedbackBody(_Body):
    """``POST /v1/sessions/{id}/feedback``: an outcome and/or a rating, recorded with the session."""

    outcome: Literal["success", "failure"] | None = None
    rating: float | None = Field(None, ge=-1.0, le=5.0)
    comment: str | None = Field(None, max_length=2000)


def _options(task_id: str | None, level: int | None) -> dict:
    return {k: v for k, v in (("task_id", task_id), ("level", level)) if v is not None}


@router.get("/v1/envs")
async def list_envs(request: Request) -> dict:
    """The registered environment ids, and the default one (the first loaded version's training env)."""
    service: Service = request.app.state.service
    first = next(iter(service.versions.values()), None)
    return {"data": env_ids(), "default": first.config.env.id if first is not None else None}


@router.post("/v1/sessions")
async def open_session(body: SessionCreate, request: Request) -> dict:
    """Open a session; returns its id and, for an environment session, the task."""
    service: Service = request.app.state.service
    env_fields = (body.seed, body.task_id, body.level, body.database, body.tasks, body.files, body.role, body.partner)
    if body.env is None and any(x is not None for x in env_fields):
        raise RequestError("Expected seed/task_id/level/files/database/tasks/role/partner only with env (an "
                           "environment session)")
    s = await service.open_session(env_id=body.env, model=body.model, temperature=body.temperature, seed=body.seed,
                                   options=_options(body.task_id, body.level), files=body.data_files(),
                                   seat=(body.role, body.partner), sample_seed=body.sample_seed)
    request.state.arm = s.arm
    return s.public(service.store.timeout_s)


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> dict:
    """The session's state (no heartbeat: reading does not keep it alive)."""
    service: Service = request.app.state.service
    return service.store.get(session_id).public(service.store.timeout_s)


@router.post("/v1/sessions/{session_id}/turns")
async def session_turn(session_id: str, body: TurnBody, request: Request) -> dict:
    """Run the agent: one reply to ``message`` (chat) or up to ``max_steps`` tool-using turns (environment)."""
    service: Service = request.app.state.service
    s = service.store.get(session_id)
    request.state.arm = s.arm
    async with s.lock:
        s.touch()
        if s.kind == "env":
            if body.message is not None:
                raise RequestError("Expected no message for an environment session (the environment answers the "
                                   "agent), got one")
            turns = await service.env_turns(s, max_steps=body.max_steps)
            out = {"turns": turns}
        else:
            if body.message is None:
                raise RequestError("Expected a message for a chat session, got none")
            if len(body.message) > service.config.max_message_chars:
                raise RequestError(f"message: Expected at most {service.config.max_message_chars} characters, "
                                   f"got {len(body.message)}")
            out = {"turns": [await service.chat_turn(s, body.message)]}
        s.touch()
    return {**out, "session": s.public(service.store.timeout_s)}


@router.post("/v1/sessions/{session_id}/heartbeat")
async def heartbeat(session_id: str, request: Request) -> dict:
    """Keep the session alive."""
    service: Service = request.app.state.service
    s = service.store.get(session_id)
    s.touch()
    return {"id": s.id, "expires_in_s": service.store.timeout_s}


@router.post("/v1/sessions/{session_id}/reset")
async def reset(session_id: str, request: Request, body: ResetBody | None = None) -> dict:
    """Record the conversation so far and start over (an environment session gets a new task)."""
    service: Service = request.app.state.service
    s = service.store.get(session_id)
    body = body or ResetBody()
    if s.kind == "chat" and any(x is not None for x in (body.seed, body.task_id, body.level)):
        raise RequestError("Expected seed/task_id/level only for an environment session")
    async with s.lock:
        s.touch()
        await service.reset_session(s, seed=body.seed, options=_options(body.task_id, body.level))
    return s.public(service.store.timeout_s)


@router.post("/v1/sessions/{session_id}/feedback")
async def feedback(session_id: str, body: FeedbackBody, request: Request) -> dict:
    """Attach an outcome or a rating (kept in the session's record; outcomes feed the ramp's guard)."""
    service: Service = request.app.state.service
    if body.outcome is None and body.rating is None and body.comment is None:
        raise RequestError("Expected an outcome, a rating or a comment, got none")
    s = service.store.get(session_id)
    s.touch()
    service.add_feedback(s, body.model_dump(exclude_none=True))
    return {"id": s.id, "feedback": len(s.feedback)}


@router.delete("/v1/sessions/{session_id}")
async def close(session_id: str, request: Request) -> dict:
    """Close the session: its state is cleared and, with ``--record``, it is written as an episode record."""
    service: Service = request.app.state.service
    s = service.store.get(session_id)
    async with s.lock:
        if service.store.pop(session_id) is None:
            service.store.get(session_id)  # raises 404: closed meanwhile
        service.finish(s, reason="closed")
    return {"id": s.id, "object": "session", "deleted": True, "recorded": bool(service.recorder and s.turns)}
