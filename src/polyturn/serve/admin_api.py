"""Admin endpoints (bearer token): traffic shares, the ramp, rollback, loading a version.

The token comes from ``POLYTURN_ADMIN_TOKEN`` or ``--admin-token-file``;
without one the admin endpoints answer 403. Versions load only from the
configured checkpoint directories.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from polyturn.serve.conversation import RequestError
from polyturn.serve.service import Service, inside


def require_admin(request: Request) -> None:
    """The request must carry ``Authorization: Bearer <admin token>``."""
    token = request.app.state.service.config.admin_token
    if not token:
        raise HTTPException(403, "Admin endpoints are disabled: start the server with POLYTURN_ADMIN_TOKEN set")
    got = request.headers.get("authorization", "")
    scheme, _, value = got.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(value.strip().encode(), token.encode()):
        raise HTTPException(401, "Expected header 'Authorization: Bearer <admin token>', got a missing or wrong token")


router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SharesBody(_Body):
    """Traffic shares by version (normalised)."""

    shares: dict[str, float] = Field(min_length=1, max_length=64)


class RampBody(_Body):
    """A staged shift to ``version``."""

    version: str = Field(max_length=200)
    stages: list[float] = Field([0.05, 0.2, 1.0], min_length=1, max_length=20)
    dwell_s: float = Field(300.0, ge=0.0, le=7 * 86400)
    max_error_rate: float = Field(0.05, ge=0.0, le=1.0)
    min_success_rate: float | None = Field(None, ge=0.0, le=1.0)
    max_cost_per_session: dict[str, float] = Field(
        default_factory=dict, max_length=16, description="Cost term -> the most it may cost per finished environment "
        "episode on the new version, e.g. {\"cost/violation\": 0.05}; past it the ramp stops and traffic returns.")
    min_samples: int = Field(20, ge=0, le=1_000_000)


class LoadBody(_Body):
    """A checkpoint to load as a new version (inside the configured checkpoint directories)."""

    checkpoint: str = Field(min_length=1, max_length=1000)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")


def _service(request: Request) -> Service:
    return request.app.state.service


@router.get("/routing")
async def routing_state(request: Request) -> dict:
    """Shares, the stable version, per-arm counts, the ramp and recent routing events."""
    return _service(request).router.state()


@router.post("/routing/shares")
async def set_shares(body: SharesBody, request: Request) -> dict:
    """Set the traffic split now (new sessions only; live ones keep their version)."""
    s = _service(request)
    try:
        s.router.set_shares(body.shares)
    except ValueError as e:
        raise RequestError(str(e)) from None
    s.update_share_gauges()
    return s.router.state()


@router.post("/routing/ramp")
async def start_ramp(body: RampBody, request: Request) -> dict:
    """Start a guarded ramp to a version (5% -> 20% -> 100% by default)."""
    s = _service(request)
    try:
        s.router.start_ramp(body.version, stages=tuple(body.stages), dwell_s=body.dwell_s,
                            max_error_rate=body.max_error_rate, min_success_rate=body.min_success_rate,
                            max_cost_per_session=body.max_cost_per_session, min_samples=body.min_samples)
    except ValueError as e:
        raise RequestError(str(e)) from None
    s.update_share_gauges()
    return s.router.state()


@router.post("/routing/rollback")
async def rollback(request: Request) -> dict:
    """All new sessions to the stable (previous) version at once."""
    s = _service(request)
    s.router.rollback()
    s.update_share_gauges()
    return s.router.state()


@router.post("/versions")
async def load_version(body: LoadBody, request: Request) -> dict:
    """Load a checkpoint as a new version (share 0 until shares or a ramp give it traffic)."""
    s = _service(request)
    path = Path(body.checkpoint)
    if not inside(path, s.config.checkpoint_dirs) or not path.is_dir():
        raise RequestError(f"Expected a checkpoint directory inside {s.config.checkpoint_dirs}, "
                           f"got {body.checkpoint!r} (start the server with --checkpoint-dir DIR to allow "
                           "loading from DIR)")
    try:
        v = await asyncio.to_thread(s.load_version, path, name=body.name)
    except (ValueError, FileNotFoundError, OSError) as e:
        raise RequestError(str(e)) from None
    return {"id": v.name, "object": "model", "path": str(v.path), "shares": s.router.shares}
