"""The ramp's off-policy gate (``polyturn serve --ope-margin``): a new version goes past 20% of traffic only when
its off-policy estimate on the incumbent's recorded sessions is not worse than the incumbent by more than a margin.

The check (:class:`OPEGate`, run by :class:`~polyturn.serve.routing.Router` in a thread when a ramp reaches the
gate) reads the sessions the incumbent (the ramp's baseline) served and recorded (``--record DIR``, plus any
``--ope-data`` files: records whose ``policy_version`` is the baseline's name), loads its own copy of the new
version's checkpoint (the serving engine's model is never touched from this thread) and estimates the new version's
success or return on them (:func:`polyturn.acting.ope.estimate`). It passes when the estimate's lower bound is at
least the incumbent's value on the same sessions (their mean: the on-policy estimate) minus the margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from polyturn.acting.checkpoint import load_checkpoint
from polyturn.acting.jsonl import RECORD_FILE
from polyturn.acting.ope import estimate, load_value_critic, read_records, usable
from polyturn.serve.routing import GateVerdict


@dataclass
class OPEGateSettings:
    """The gate's settings (``polyturn serve --ope-*``).

    ``margin``: how far below the incumbent the new version's lower bound may be; ``metric``: success rate or
    return; ``estimator``: per-decision WIS or doubly robust (return only, with the new version's separate
    critic); ``clip``, ``confidence``, ``resamples``: the estimate's weight clip and bootstrap; ``min_sessions``:
    fewer usable recorded sessions of the incumbent refuse the ramp; ``max_sessions``: the check reads the most recent ones
    only (re-scoring costs a forward pass per session); ``share``: the traffic share the gate holds
    the ramp at; ``data``: more record files than the server's own ``--record`` directory.
    """

    margin: float
    metric: Literal["success", "return"] = "success"
    estimator: Literal["wis", "dr"] = "wis"
    clip: float = 10.0
    confidence: float = 0.95
    resamples: int = 1000
    min_sessions: int = 20
    max_sessions: int = 1000
    share: float = 0.2
    data: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.margin >= 0:
            raise ValueError(f"--ope-margin: expected >= 0 (in the metric's units), got {self.margin}")
        if self.estimator == "dr" and self.metric != "return":
            raise ValueError("--ope-estimator dr: expected --ope-metric return (the critic predicts the return, not "
                             f"success), got --ope-metric {self.metric}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"--ope-confidence: expected a confidence in (0, 1), got {self.confidence}")
        if self.min_sessions < 2:
            raise ValueError(f"--ope-min-sessions: expected >= 2 (a bootstrap needs two), got {self.min_sessions}")
        if self.max_sessions < self.min_sessions:
            raise ValueError(f"--ope-max-sessions: expected at least --ope-min-sessions ({self.min_sessions}), got "
                             f"{self.max_sessions}")
        for d in self.data:
            if not Path(d).exists():
                raise FileNotFoundError(f"--ope-data: expected recorded sessions, got {d!r}, which does not exist")


class OPEGate:
    """The check the router runs: ``gate(new_arm, baseline) -> GateVerdict`` (see the module docstring)."""

    def __init__(self, settings: OPEGateSettings, *, record_dir: str | None,
                 checkpoint: Callable[[str], Path]) -> None:
        self.settings = settings
        self.record_dir = Path(record_dir) if record_dir else None
        self.checkpoint = checkpoint

    def records(self, baseline: str) -> tuple[list[dict], int]:
        """The baseline's recorded sessions that can be re-scored (the most recent ``max_sessions``), and how many of
        its sessions were recorded."""
        paths = [Path(p) for p in self.settings.data]
        if self.record_dir is not None and (self.record_dir / RECORD_FILE).is_file():
            paths.append(self.record_dir / RECORD_FILE)
        recs = [r for r in read_records(paths, partial_tail=True) if r.get("policy_version") == baseline]
        return [r for r in recs if usable(r)][-self.settings.max_sessions:], len(recs)

    def __call__(self, arm: str, baseline: str) -> GateVerdict:
        st = self.settings
        recs, n_all = self.records(baseline)
        if len(recs) < st.min_sessions:
            return GateVerdict(False, f"{len(recs)} usable recorded sessions of {baseline} ({n_all} recorded; usable: "
                                      f"sampled at temperature > 0, with log-probs), expected at least "
                                      f"{st.min_sessions} to estimate {arm} on; serve {baseline} with --record and "
                                      "temperature > 0 longer, or lower --ope-min-sessions",
                               {"sessions": len(recs)})
        ckpt = load_checkpoint(self.checkpoint(arm))  # its own copy: the engine's model stays the engine thread's
        critic, why = load_value_critic(ckpt.actor_dir.parent) if st.estimator == "dr" else (None, "")
        rep = estimate(ckpt.actor, recs, policy=arm, critic=critic, dr_unavailable=why, clip=st.clip,
                       confidence=st.confidence, n_resamples=st.resamples, source=f"recorded sessions of {baseline}")
        if st.estimator == "dr" and rep.dr is not None:
            est, name = rep.dr[st.metric], "doubly robust"
        else:
            est, name = rep.wis[st.metric], "per-decision WIS" + (f" (doubly robust unavailable: {why})"
                                                                  if st.estimator == "dr" else "")
        incumbent = rep.recorded[st.metric]
        floor = incumbent - st.margin
        passed = est.lo >= floor
        message = (f"{arm}'s off-policy {st.metric} lower bound {est.lo:.3f} ({name}, {st.confidence:.0%} bootstrap "
                   f"over {rep.episodes} sessions of {baseline}, ESS {rep.ess:.1f}) is "
                   f"{'at or above' if passed else 'below'} {baseline}'s {incumbent:.3f} minus the margin "
                   f"{st.margin:g} ({floor:.3f})")
        return GateVerdict(passed, message, {
            "metric": st.metric, "estimator": name, "estimate": est.value, "lower": est.lo, "upper": est.hi,
            "incumbent": incumbent, "margin": st.margin, "sessions": rep.episodes, "ess": rep.ess})
