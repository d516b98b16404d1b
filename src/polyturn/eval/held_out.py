"""Held-out, before against after: two of a run's held-out evaluations (``eval_bc.jsonl`` and ``eval_final.jsonl``,
and their ``_sampled`` twins) paired on the task seed: success, return, turns and invalid actions of each, the
env's own metrics and cost terms, how many tasks were gained and lost with the exact sign test, and success by
level and by the env spec's breakdowns. ``polyturn diagnose``'s section 4; it reads the files the training wrote.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.registry import spec_or_none
from polyturn.eval.document import Block, Heading, Para, Table
from polyturn.eval.metrics import METRIC_BY_NAME, EpisodeStats, cost_metric_specs, env_metric_specs, episode_stats
from polyturn.eval.records import gained_lost, is_success, paired
from polyturn.eval.stats import sign_test


#: The held-out evaluations the trainer writes (``eval_<tag>.jsonl``) that diagnose compares, before -> after.
HELD_OUT_PAIRS = (("bc", "final"), ("bc_sampled", "final_sampled"))
HELD_OUT_METRICS = ("success_rate", "return_mean", "turns_mean", "invalid_action_rate")


@dataclass
class HeldOutComparison:
    """Two held-out evaluations of one run, paired on the tasks both played (same env and task seed)."""

    before: str  #: the evaluations' tags, e.g. "bc" and "final"
    after: str
    episodes: int  #: tasks in both
    metrics: dict[str, tuple[float, float]]  #: each of HELD_OUT_METRICS: (before, after)
    gained: int  #: tasks solved after and not before
    lost: int  #: tasks solved before and not after
    p_value: float  #: exact two-sided sign test of gained against lost
    by_level: list[tuple[str, int, int, int]]  #: (level, tasks, solved before, solved after); empty without levels
    #: the env spec's breakdowns (CustomerService: intent): name -> (group, tasks, solved before, solved after)
    groups: dict[str, list[tuple[str, int, int, int]]] = field(default_factory=dict)
    #: the env spec's own metrics (error responses, deal worth, ...) and the records' cost terms (mean per
    #: episode): name -> (before, after)
    env_metrics: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: the two success rates, gained / lost and the sign test's p."""
        s0, s1 = self.metrics["success_rate"]
        return (f"held-out {self.before} -> {self.after} ({self.episodes} tasks): success {s0:.3f} -> {s1:.3f}, "
                f"{self.gained} gained / {self.lost} lost, sign test p {self.p_value:.3g}")


def _record_metrics(stats: Sequence[EpisodeStats]) -> dict[str, float]:
    """As the trainer summarises its evaluations: evaluate's definitions (:data:`polyturn.eval.metrics.METRICS`;
    invalid actions pooled over turns) and the mean turns per episode."""
    out = {name: METRIC_BY_NAME[name].stat(stats) or 0.0 for name in HELD_OUT_METRICS if name != "turns_mean"}
    return out | {"turns_mean": sum(s.n_turns for s in stats) / max(1, len(stats))}


def compare_evaluations(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], *, tags: tuple[str, str]
                        ) -> HeldOutComparison | None:
    """Pair two evaluations' episode records on the task (:func:`polyturn.eval.records.paired`); None when they
    share no task."""
    pairs = paired(before, after)
    if not pairs:
        return None
    ra, rb = [a for a, _ in pairs], [b for _, b in pairs]
    sa, sb = [episode_stats(r) for r in ra], [episode_stats(r) for r in rb]
    ma, mb = _record_metrics(sa), _record_metrics(sb)
    gained, lost = gained_lost(pairs)
    levels: list[tuple[str, int, int, int]] = []
    if all(r.get("level") is not None for r in ra):
        levels = _success_by(pairs, lambda r: r["level"])
    spec = spec_or_none(ra[0].get("env_id"))
    groups = {name: _success_by(pairs, fn) for name, fn in (spec.breakdowns if spec else {}).items()}
    env_metrics = {m.name: (m.stat(sa), m.stat(sb))
                   for m in (*env_metric_specs([ra[0].get("env_id")]), *cost_metric_specs([*ra, *rb]))}
    return HeldOutComparison(tags[0], tags[1], len(pairs), {k: (ma[k], mb[k]) for k in HELD_OUT_METRICS},
                             gained, lost, sign_test(gained, lost), levels, groups, env_metrics)


def _success_by(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]], key: Callable[[dict[str, Any]], Any]
                ) -> list[tuple[str, int, int, int]]:
    """(group, tasks, solved before, solved after) for each group ``key`` gives the first record of a pair."""
    keyed = [(key(x), x, y) for x, y in pairs]
    rows = []
    for g in sorted({k for k, _, _ in keyed}, key=lambda v: (str(type(v)), v)):
        at = [(x, y) for k, x, y in keyed if k == g]
        rows.append((str(g), len(at), sum(is_success(x) for x, _ in at), sum(is_success(y) for _, y in at)))
    return rows


def held_out_comparisons(run: Path) -> list[HeldOutComparison]:
    """Each pair of :data:`HELD_OUT_PAIRS` whose two ``eval_<tag>.jsonl`` files ``run`` holds."""
    out = []
    for before, after in HELD_OUT_PAIRS:
        pa, pb = run / f"eval_{before}.jsonl", run / f"eval_{after}.jsonl"
        if pa.is_file() and pb.is_file():
            cmp = compare_evaluations(read_jsonl(pa), read_jsonl(pb), tags=(before, after))
            if cmp is not None:
                out.append(cmp)
    return out


def _f(v: float | None) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"


def held_out_blocks(comparisons: Sequence[HeldOutComparison]) -> list[Block]:
    """The "Held-out" section: each comparison's metrics, its paired counts and its success by level."""
    b: list[Block] = [Heading("Held-out: BC against final")]
    if not comparisons:
        b.append(Para("No pair of held-out evaluations (eval_bc.jsonl and eval_final.jsonl) in the run yet."))
    for c in comparisons:
        b.append(Heading(f"{c.before} -> {c.after}", 3))
        b.append(Para(f"{c.episodes} tasks played by both, paired on the task seed: {c.gained} solved only by "
                      f"{c.after}, {c.lost} only by {c.before}; exact two-sided sign test p = {c.p_value:.3g}."))
        rows = [*c.metrics.items(), *c.env_metrics.items()]
        b.append(Table(("metric", c.before, c.after), tuple((k, _f(v0), _f(v1)) for k, (v0, v1) in rows)))
        for name, by in (("level", c.by_level), *c.groups.items()):
            if by:
                b.append(Table((name, "tasks", f"solved ({c.before})", f"solved ({c.after})"),
                               tuple((g, str(n), str(s0), str(s1)) for g, n, s0, s1 in by)))
    return b
