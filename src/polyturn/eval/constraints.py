"""The constraints section of ``polyturn diagnose``: each constrained cost term's cost per episode, its limit, the
margin and the Lagrange multiplier over the run, read from ``metrics.jsonl`` (the ``constraint/<term>/...`` keys a
run with a ``constraints`` section logs every iteration; docs/envs/customer-service.md, "Constrained RL")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polyturn.eval.document import Block, Heading, Para, Table
from polyturn.health.signals import num, rl_records, series

#: Iterations the "recent" cost averages over.
RECENT = 5


def constraint_terms(records: Sequence[dict[str, Any]]) -> list[str]:
    """The constrained cost terms a log names (``constraint/<term>/lambda``), in the order first logged."""
    out: dict[str, None] = {}
    for r in rl_records(records):
        for k in r:
            if k.startswith("constraint/") and k.endswith("/lambda"):
                out.setdefault(k.removeprefix("constraint/").removesuffix("/lambda"))
    return list(out)


@dataclass(frozen=True)
class ConstraintSummary:
    """One constrained term over a run: the last iteration's figures, the recent mean cost, how often it was over."""

    term: str
    limit: float
    cost: float  #: the last iteration's mean cost per episode
    recent_cost: float  #: mean over the last :data:`RECENT` iterations
    margin: float  #: limit - cost, last iteration
    multiplier: float  #: last iteration
    max_multiplier: float
    over: int  #: iterations whose cost passed the limit
    iterations: int
    explained_variance: float | None  #: the cost critic's, last iteration (None: a group baseline)


def summarize_constraints(records: Sequence[dict[str, Any]]) -> list[ConstraintSummary]:
    """A :class:`ConstraintSummary` per constrained term in the log (none: an unconstrained run)."""
    out = []
    for term in constraint_terms(records):
        pre = f"constraint/{term}/"
        _, cost = series(records, pre + "cost")
        _, margin = series(records, pre + "margin")
        _, lam = series(records, pre + "lambda")
        if not len(cost) or len(cost) != len(margin) or not len(lam):
            continue
        limits = cost + margin
        _, ev = series(records, pre + "explained_variance")
        out.append(ConstraintSummary(
            term=term, limit=float(limits[-1]), cost=float(cost[-1]), recent_cost=float(cost[-RECENT:].mean()),
            margin=float(margin[-1]), multiplier=float(lam[-1]), max_multiplier=float(lam.max()),
            over=int((margin < 0).sum()), iterations=len(cost), explained_variance=float(ev[-1]) if len(ev) else None))
    return out


def curve_keys(summaries: Sequence[ConstraintSummary]) -> list[str]:
    """The keys a constraints figure shows: each term's cost and multiplier."""
    return [f"constraint/{s.term}/{k}" for s in summaries for k in ("cost", "lambda")]


def _f(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.4g}"


def constraint_blocks(records: Sequence[dict[str, Any]]) -> list[Block]:
    """The section's heading, explanation and table (nothing for a log without constraints)."""
    summaries = summarize_constraints(records)
    if not summaries:
        return []
    b: list[Block] = [Heading("Constraints")]
    b.append(Para("Each constrained cost term's mean cost per episode against its limit, the margin (limit - cost) "
                  "and its Lagrange multiplier (lambda: what one unit of the cost is charged in scaled reward), "
                  f"from the last RL iteration; recent cost is the mean of the last {RECENT}. A multiplier at 0 "
                  "with a positive margin: the constraint holds and does not bind; one rising with a negative "
                  "margin: the policy is being pushed back under the limit; one pinned at constraints.max: the "
                  "limit may be out of the policy's reach (raise constraints.max or the limit, or lower the lr)."))
    b.append(Table(("term", "limit", "cost", f"recent cost ({RECENT})", "margin", "lambda", "max lambda",
                    "iterations over", "cost critic EV"), tuple(
        (s.term, _f(s.limit), _f(s.cost), _f(s.recent_cost), _f(s.margin), _f(s.multiplier), _f(s.max_multiplier),
         f"{s.over}/{s.iterations}", _f(s.explained_variance)) for s in summaries)))
    dropped = [num(r.get("constraint/successes_dropped")) for r in rl_records(records)]
    dropped = [d for d in dropped if d is not None]
    if dropped:
        b.append(Para(f"rft: {sum(dropped):.0f} successes were not imitated for their costs over the run "
                      f"({dropped[-1]:.0f} in the last iteration)."))
    return b
