"""A run's position, as a typed object: what a checkpoint's ``trainer_state.json`` holds and resume restores."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

#: The role of a run with one policy (every single-agent environment).
AGENT = "agent"


@dataclass
class RunState:
    """Where a run stands.

    Attributes:
        phase: ``bc`` until behaviour cloning has ended (a run killed during BC restarts it), then ``offline`` while
            an offline phase is to run (config ``offline``: it replaces BC or follows it; a run killed in it restarts
            it), then ``rl``.
        iter: RL iterations done.
        bc_step: steps logged before RL, BC's and the offline phase's (RL iterations are logged at ``bc_step + iter``).
        task_counter: the next training seed RL draws.
        skipped: updates skipped for a non-finite loss or gradient (``run.on_nonfinite: skip``).
        eval: held-out evaluations by tag (``bc``, ``iter0010``, ``final``, ``final_sampled``, ...).
        phase_s: wall seconds spent per phase, kept across resumes.
        warned: health-check warnings already reported (``kind:metric``), not repeated after a resume.
        actor_steps: RL optimizer steps per policy (its learning-rate warm-up reads them).
        pool: self-play's opponent pool, the checkpoints it holds (oldest first).
        multipliers: constrained RL's Lagrange multipliers by cost term (``constraints``), as last stepped.
        pending_eval: the phase (``bc``, ``offline``) whose weights were checkpointed before its held-out evaluation
            ran; a run killed during that evaluation resumes there and evaluates them, not the phase again.
    """

    phase: Literal["bc", "offline", "rl"] = "bc"
    iter: int = 0
    bc_step: int = 0
    task_counter: int = 0
    skipped: int = 0
    eval: dict[str, dict[str, float]] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)
    warned: list[str] = field(default_factory=list)
    actor_steps: dict[str, int] = field(default_factory=dict)
    pool: list[str] = field(default_factory=list)
    multipliers: dict[str, float] = field(default_factory=dict)
    pending_eval: str = ""

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the block's wall seconds to :attr:`phase_s` (kept in checkpoints, so a resumed run's summary counts
        the time before the kill too; what a killed step had spent is lost)."""
        t = time.time()
        yield
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + time.time() - t

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``trainer_state.json``; a one-policy run writes ``actor_steps`` as a number, as runs did
        before the state was typed (so their checkpoints resume)."""
        out = dataclasses.asdict(self)
        if set(self.actor_steps) <= {AGENT}:
            out["actor_steps"] = self.actor_steps.get(AGENT, 0)
        # Written only when used: other runs' state files stay as they were.
        for key in ("pool", "multipliers", "pending_eval"):
            if not out[key]:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        """Read :meth:`to_json`'s form; a key this version does not know is an error naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Expected trainer_state.json keys from {sorted(known)}, got {unknown}: written by a "
                             "newer polyturn?")
        data = dict(data)
        steps = data.get("actor_steps", {})
        data["actor_steps"] = {AGENT: int(steps)} if isinstance(steps, int) else dict(steps)
        return cls(**data)
