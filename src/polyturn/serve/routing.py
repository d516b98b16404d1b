"""A/B routing between checkpoint versions: shares, sticky sessions, a guarded ramp, rollback.

A session is routed once, when it opens, and keeps its arm (sticky); a share
change only affects sessions opened after it, so live sessions are never moved
or dropped. A :class:`Ramp` moves a new arm through stages (5% -> 20% -> 100%
by default), advancing after ``dwell_s`` once the arm has ``min_samples``
requests in the stage; its guard stops the ramp and sends traffic back to the
stable arm when the new arm's error rate exceeds ``max_error_rate``, its
success rate (from environment outcomes and feedback) falls below
``min_success_rate``, or a cost term's mean per finished environment episode
(``info["cost_terms"]``: a CustomerService ``cost/violation``) exceeds its
limit in ``max_cost_per_session``. :meth:`Router.rollback` does the same at
once, also after a ramp completed (back to its baseline).

An off-policy gate (``Router(gate=...)``, ``polyturn serve --ope-margin``) holds
a ramp before any stage above ``gate_share`` (20%): when the ramp reaches the
last stage at or below it, the gate's check (the new arm's off-policy estimate
on the baseline's recorded sessions) runs in a thread, requests go on being
routed meanwhile, and the ramp advances past the gate only once the check
passes; a failed check stops the ramp like a guard, saying why. A rollback or a
new split does not wait for it: the check's result then lands on no ramp. With
the gate on, a ramp must start at or below ``gate_share``; shares set by hand
are the operator's and are not gated.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

log = logging.getLogger(__name__)


@dataclass
class ArmStats:
    """Counts of one arm since the current ramp stage began (or since start)."""

    requests: int = 0
    errors: int = 0
    outcomes: int = 0
    successes: int = 0
    #: finished environment episodes whose cost terms were counted, and each term's sum over them
    episodes: int = 0
    costs: dict[str, float] = field(default_factory=dict)


@dataclass
class GateVerdict:
    """The outcome of an off-policy gate's check: whether the ramp may go past the gate, and why (a sentence
    with the numbers), plus the numbers themselves for the admin API."""

    passed: bool
    message: str
    details: dict = field(default_factory=dict)


#: An off-policy gate's check: ``(new arm, baseline arm) -> verdict``; it may take seconds and runs in a thread.
Gate = Callable[[str, str], GateVerdict]


@dataclass
class Ramp:
    """A staged traffic shift to ``arm`` (see the module docstring)."""

    arm: str
    baseline: str
    stages: tuple[float, ...] = (0.05, 0.2, 1.0)
    dwell_s: float = 300.0
    max_error_rate: float = 0.05
    min_success_rate: float | None = None
    #: cost term -> the most it may cost per finished environment episode on the ramped arm (after min_samples)
    max_cost_per_session: dict[str, float] = field(default_factory=dict)
    min_samples: int = 20
    stage: int = 0
    stage_started: float = 0.0
    status: str = "running"  # running | done | stopped
    reason: str = ""
    stats: ArmStats = field(default_factory=ArmStats)
    #: The off-policy gate before the first stage above the router's gate_share: ``status`` off (no gate) |
    #: waiting | running | passed | failed, its ``message`` and numbers.
    gate: dict = field(default_factory=lambda: {"status": "off", "message": ""})

    def __post_init__(self) -> None:
        if not self.stages or any(not 0.0 < s <= 1.0 for s in self.stages) or list(self.stages) != sorted(self.stages):
            raise ValueError(f"Expected increasing ramp stages in (0, 1], got {list(self.stages)}")
        if self.dwell_s < 0 or not 0.0 <= self.max_error_rate <= 1.0 or self.min_samples < 0:
            raise ValueError("Expected dwell_s >= 0, max_error_rate in [0, 1] and min_samples >= 0, got "
                             f"{self.dwell_s}, {self.max_error_rate}, {self.min_samples}")
        bad = {k: v for k, v in self.max_cost_per_session.items() if not (0.0 <= v < math.inf)}
        if bad:
            raise ValueError(f"Expected max_cost_per_session limits >= 0 and finite (a mean per session), got {bad}")


class Router:
    """Chooses an arm per new session; keeps shares, per-arm counts and the ramp."""

    def __init__(self, arms: Sequence[str], *, seed: int = 0, clock: Callable[[], float] = time.monotonic,
                 gate: Gate | None = None, gate_share: float = 0.2) -> None:
        if not arms:
            raise ValueError("Expected at least one version to route to, got none")
        if not 0.0 < gate_share < 1.0:
            raise ValueError(f"Expected an off-policy gate share in (0, 1), got {gate_share}")
        self.gate = gate
        self.gate_share = gate_share
        self.arms = list(dict.fromkeys(arms))
        self.shares = {a: (1.0 if i == 0 else 0.0) for i, a in enumerate(self.arms)}
        self.stable = self.arms[0]
        self.previous = self.stable  # where a rollback sends traffic: the stable version before the last change
        self.ramp: Ramp | None = None
        self.stats = {a: ArmStats() for a in self.arms}
        self.clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.events: list[dict] = []

    # ----- changing the split -------------------------------------------------------------------
    def add_arm(self, arm: str) -> None:
        """A newly loaded version, with share 0 until shares or a ramp give it traffic."""
        with self._lock:
            if arm not in self.shares:
                self.arms.append(arm)
                self.shares[arm] = 0.0
                self.stats[arm] = ArmStats()

    def set_shares(self, shares: dict[str, float]) -> dict[str, float]:
        """Set the traffic split (normalised); arms left out get 0. Cancels a running ramp."""
        unknown = sorted(set(shares) - set(self.shares))
        if unknown:
            raise ValueError(f"Expected shares for loaded versions {self.arms}, got unknown {unknown}")
        total = sum(shares.values())
        if any(not math.isfinite(v) or v < 0 for v in shares.values()) or not 0 < total < math.inf:
            raise ValueError(f"Expected finite non-negative shares with a positive finite sum, got {shares}")
        with self._lock:
            self.stable = self.previous = self._leader()
            self.shares = {a: shares.get(a, 0.0) / total for a in self.arms}
            if self.ramp is not None and self.ramp.status == "running":
                self._end_ramp("stopped", "shares set by hand")
            self._event("shares", shares=dict(self.shares))
        return dict(self.shares)

    def start_ramp(self, arm: str, **kwargs) -> Ramp:
        """Start shifting traffic to ``arm`` from the arm that leads now (kwargs: :class:`Ramp` fields)."""
        if arm not in self.shares:
            raise ValueError(f"Expected a loaded version among {self.arms}, got {arm!r}")
        with self._lock:
            baseline = self._leader()
            if baseline == arm:
                raise ValueError(f"Expected to ramp a version other than the leading one ({arm!r})")
            ramp = Ramp(arm=arm, baseline=baseline, **kwargs)
            if self.gate is not None and ramp.stages[0] > self.gate_share:
                raise ValueError(f"Expected a first stage at or below {self.gate_share:.0%} (the off-policy gate, "
                                 "--ope-margin, checks the version before its share passes that), got stages "
                                 f"{list(ramp.stages)}")
            if self.gate is not None and ramp.stages[-1] > self.gate_share:
                ramp.gate = {"status": "waiting", "share": self.gate_share,
                             "message": f"the off-policy check runs when the ramp reaches its last stage at or "
                                        f"below {self.gate_share:.0%}"}
            ramp.stage_started = self.clock()
            self.stable = self.previous = baseline
            self.ramp = ramp
            self._apply_stage()
            self._event("ramp_start", arm=arm, baseline=baseline, stages=list(ramp.stages))
        return ramp

    def rollback(self) -> dict[str, float]:
        """All new traffic at once to the version that was stable before the last change: the ramp's baseline
        (a running ramp stops; after a completed ramp too, which made the ramped version stable), or the
        version that led before shares were set by hand. That version becomes the stable one."""
        with self._lock:
            if self.ramp is not None and self.ramp.status == "running":
                self._end_ramp("stopped", "rollback")
            self.stable = self.previous
            self.shares = {a: (1.0 if a == self.stable else 0.0) for a in self.arms}
            self._event("rollback", to=self.stable)
        return dict(self.shares)

    def tick(self) -> None:
        """Advance or stop the ramp (called every second by the server and on every routing)."""
        with self._lock:
            r = self.ramp
            if r is None or r.status != "running":
                return
            s = r.stats
            if s.requests >= r.min_samples and s.requests and s.errors / s.requests > r.max_error_rate:
                self._fail(f"error rate {s.errors / s.requests:.3f} > {r.max_error_rate}")
                return
            if (r.min_success_rate is not None and s.outcomes >= max(1, r.min_samples)
                    and s.successes / s.outcomes < r.min_success_rate):
                self._fail(f"success rate {s.successes / s.outcomes:.3f} < {r.min_success_rate}")
                return
            for term, limit in r.max_cost_per_session.items():
                if s.episodes >= max(1, r.min_samples) and s.costs.get(term, 0.0) / s.episodes > limit:
                    self._fail(f"{term} {s.costs.get(term, 0.0) / s.episodes:.3f} per session > {limit}")
                    return
            gated = r.stage + 1 < len(r.stages) and r.stages[r.stage + 1] > self.gate_share \
                and r.gate["status"] != "off"
            if gated and r.gate["status"] == "waiting":
                self._start_gate(r)
            if gated and r.gate["status"] != "passed":
                return  # running: routing goes on at this stage meanwhile
            if self.clock() - r.stage_started >= r.dwell_s and s.requests >= r.min_samples:
                if r.stage + 1 >= len(r.stages):
                    self._end_ramp("done", "")
                    self.stable = r.arm
                    return
                r.stage += 1
                r.stage_started = self.clock()
                r.stats = ArmStats()
                self._apply_stage()
                self._event("ramp_stage", arm=r.arm, share=r.stages[r.stage])

    # ----- routing and counting ------------------------------------------------------------------
    def choose(self) -> str:
        """The arm of a new session, drawn with the current shares."""
        self.tick()
        with self._lock:
            x = self._rng.random()
            acc = 0.0
            for arm in self.arms:
                acc += self.shares[arm]
                if x < acc:
                    return arm
            return max(self.arms, key=lambda a: self.shares[a])

    def record(self, arm: str, *, error: bool) -> None:
        """Count a served request of ``arm``."""
        with self._lock:
            for s in self._stats_for(arm):
                s.requests += 1
                s.errors += int(error)

    def record_outcome(self, arm: str, *, success: bool) -> None:
        """Count a session outcome of ``arm`` (environment success or user feedback)."""
        with self._lock:
            for s in self._stats_for(arm):
                s.outcomes += 1
                s.successes += int(success)

    def record_costs(self, arm: str, costs: dict[str, float]) -> None:
        """Count a finished environment episode of ``arm`` and its summed cost terms (the ramp's cost guard)."""
        with self._lock:
            for s in self._stats_for(arm):
                s.episodes += 1
                for k, v in costs.items():
                    s.costs[k] = s.costs.get(k, 0.0) + float(v)

    def state(self) -> dict:
        """Shares, stable arm, per-arm counts, the ramp and recent events (JSON-ready)."""
        with self._lock:
            ramp = None
            if self.ramp is not None:
                ramp = asdict(self.ramp)
                ramp["share"] = self.shares.get(self.ramp.arm, 0.0)
            return {"shares": dict(self.shares), "stable": self.stable, "ramp": ramp,
                    "arms": {a: asdict(s) for a, s in self.stats.items()}, "events": self.events[-20:]}

    # ----- the off-policy gate -------------------------------------------------------------------
    def _start_gate(self, r: Ramp) -> None:
        """Run the gate's check on a thread (lock held: only marks the ramp and starts the thread)."""
        assert self.gate is not None
        r.gate = {"status": "running", "share": self.gate_share, "message": "off-policy check running"}
        self._event("ope_gate_start", arm=r.arm, baseline=r.baseline)
        threading.Thread(target=self._run_gate, args=(r, self.gate), name=f"ope-gate-{r.arm}", daemon=True).start()

    def _run_gate(self, r: Ramp, gate: Gate) -> None:
        try:
            verdict = gate(r.arm, r.baseline)
        except Exception as e:  # a check that cannot run lets nothing past the gate; the ramp says why
            if isinstance(e, (ValueError, OSError)):  # records or a checkpoint it cannot use: the message says why
                log.warning("off-policy gate for %s could not run: %s", r.arm, e)
            else:
                log.exception("off-policy gate for %s failed to run", r.arm)
            verdict = GateVerdict(False, f"off-policy check could not run: {type(e).__name__}: {e}")
        with self._lock:
            if self.ramp is not r or r.status != "running":  # rolled back or replaced meanwhile: nothing to gate
                return
            r.gate = {"status": "passed" if verdict.passed else "failed", "share": self.gate_share,
                      "message": verdict.message, **verdict.details}
            self._event("ope_gate_" + r.gate["status"], arm=r.arm, message=verdict.message)
            (log.info if verdict.passed else log.warning)("ramp %s: %s", r.arm, verdict.message)
            if not verdict.passed:
                self._fail(f"refused past {self.gate_share:.0%}: {verdict.message}")

    # ----- internals (lock held) ----------------------------------------------------------------
    def _leader(self) -> str:
        return max(self.arms, key=lambda a: self.shares[a])

    def _stats_for(self, arm: str) -> list[ArmStats]:
        out = [self.stats[arm]] if arm in self.stats else []
        if self.ramp is not None and self.ramp.status == "running" and self.ramp.arm == arm:
            out.append(self.ramp.stats)
        return out

    def _apply_stage(self) -> None:
        r = self.ramp
        assert r is not None
        share = r.stages[r.stage]
        self.shares = {a: 0.0 for a in self.arms}
        self.shares[r.arm] = share
        self.shares[r.baseline] += 1.0 - share

    def _fail(self, reason: str) -> None:
        assert self.ramp is not None
        self._end_ramp("stopped", reason)
        self.shares = {a: (1.0 if a == self.stable else 0.0) for a in self.arms}

    def _end_ramp(self, status: str, reason: str) -> None:
        assert self.ramp is not None
        self.ramp.status = status
        self.ramp.reason = reason
        self._event("ramp_" + status, arm=self.ramp.arm, reason=reason)

    def _event(self, kind: str, **data) -> None:
        self.events.append({"t": round(self.clock(), 3), "event": kind, **data})
        del self.events[:-100]
