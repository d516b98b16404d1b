"""Error-pattern analysis: failures grouped by signature and by embedding clusters (seed 001, 5.2).

Two complementary views of the failed episodes (any episode that is not a
success, crashed ones included):

* **Signatures** — a rule-based key per episode (:func:`failure_signature`):
  how it ended, named by the env's spec (for the SQL analyst ``wrong_answer``
  with the submitted answer's type, ``no_answer``; ``crash``), the last error
  kind, and the expected key actions it never performed. Exact, readable, but blind to *what* went wrong
  inside a turn.
* **Embedding clusters** — the failing turns (each turn with an error, or the
  last turn of a failed episode without errors) as text (action plus the
  env's answer), embedded (MiniLM by default) and grouped with k-means; k is
  the smallest k in ``k_range`` whose silhouette score (cosine) is within
  ``SILHOUETTE_TOL`` = 0.05 of the best one (failures repeat almost verbatim,
  and the silhouette would otherwise reward splitting near-duplicates apart).
  With fewer than three distinct failing turns everything is one cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyturn.envs.actions import ToolCall, parse_action
from polyturn.eval import records as R
from polyturn.eval.embed import Embedder


def failure_ending(record: dict[str, Any]) -> str:
    """How a failed episode ended, named by its env's spec (:class:`~polyturn.envs.spec.EnvSpec`).

    ``crash``; with a ``final_action`` (``submit_answer``): ``wrong_<noun>`` when it was called validly (with
    the spec's ``answer_kind`` of the last call in brackets, e.g. ``wrong_answer(number)``), else
    ``no_<noun>``; without one: ``turn_limit`` (truncated) or ``ended_by(<last action type>)``.

    >>> failure_ending({"env_id": "polyturn/SQLAnalyst-v0", "turns": []})
    'no_answer'
    >>> walk = {"action": "Action: walk_away[{}]", "info": {"action_type": "walk_away", "action_valid": True}}
    >>> failure_ending({"env_id": "polyturn/Negotiation-v0", "turns": [walk]})
    'ended_by(walk_away)'
    """
    turns = record.get("turns", [])
    if record.get("crashed"):
        return "crash"
    spec = R.env_spec_of(record)
    if spec is not None and spec.final_action:
        noun = spec.ending_noun()
        finals = [t for t in turns if R.action_type(t) == spec.final_action and R.is_valid(t)]
        if not finals:
            return f"no_{noun}"
        if spec.answer_kind is None:
            return f"wrong_{noun}"
        parsed = parse_action(str(finals[-1].get("action", "")))
        kind = spec.answer_kind(parsed.args) if isinstance(parsed, ToolCall) else "other"
        return f"wrong_{noun}({kind})"
    if turns and turns[-1].get("truncated"):
        return "turn_limit"
    return f"ended_by({R.action_type(turns[-1])})" if turns else "no_turns"


def failure_signature(record: dict[str, Any]) -> str:
    """``"<ending> | last_error=<kind> | missing=<key actions>"`` for a failed episode (:func:`failure_ending`)."""
    turns = record.get("turns", [])
    errors = [R.turn_error(t) for t in turns if R.turn_error(t)]
    missing = R.missing_key_actions(record)
    return (f"{failure_ending(record)} | last_error={errors[-1] if errors else 'none'} | "
            f"missing={','.join(missing) or 'none'}")


@dataclass
class SignatureGroup:
    """Failed episodes sharing a signature: how many, per policy, and one example."""

    signature: str
    count: int
    by_policy: dict[str, int]
    example_policy: str
    example: dict[str, Any] = field(repr=False)


def signature_groups(records_by_policy: Mapping[str, Sequence[dict[str, Any]]]) -> list[SignatureGroup]:
    """Failure signatures over every policy's failed episodes, largest group first."""
    groups: dict[str, SignatureGroup] = {}
    for policy, recs in records_by_policy.items():
        for rec in recs:
            if R.is_success(rec):
                continue
            sig = failure_signature(rec)
            g = groups.setdefault(sig, SignatureGroup(sig, 0, {}, policy, rec))
            g.count += 1
            g.by_policy[policy] = g.by_policy.get(policy, 0) + 1
    return sorted(groups.values(), key=lambda g: (-g.count, g.signature))


@dataclass(frozen=True)
class FailingTurn:
    """One failing turn: where it is, and its text as clustered."""

    policy: str
    record: dict[str, Any]
    turn: int
    text: str
    error: str
    action_type: str


def failing_turns(records_by_policy: Mapping[str, Sequence[dict[str, Any]]], *, max_chars: int = 300) -> list[FailingTurn]:
    """The failing turns of every failed episode (see the module docstring), in policy and record order."""
    out = []
    for policy, recs in records_by_policy.items():
        for rec in recs:
            if R.is_success(rec) or not rec.get("turns"):
                continue
            turns = rec["turns"]
            idx = [t for t, turn in enumerate(turns) if R.turn_error(turn)] or [len(turns) - 1]
            for t in idx:
                text = f"{turns[t].get('action', '')}\n=> {R.observation_after(rec, t)}"[:max_chars]
                out.append(FailingTurn(policy, rec, t, text, R.turn_error(turns[t]) or "none",
                                       R.action_type(turns[t])))
    return out


@dataclass
class FailureCluster:
    """A group of similar failing turns."""

    index: int
    size: int
    episodes: int
    by_policy: dict[str, int]
    top_errors: list[tuple[str, int]]
    top_actions: list[tuple[str, int]]
    example: FailingTurn = field(repr=False)

    @property
    def description(self) -> str:
        """Its most common error kinds and action types, e.g. ``error sql_error; action run_sql``."""
        errs = ", ".join(k for k, _ in self.top_errors[:2])
        acts = ", ".join(k for k, _ in self.top_actions[:2])
        return f"error {errs}; action {acts}"


@dataclass
class ClusterResult:
    """Clusters of failing turns, and how k was chosen."""

    clusters: list[FailureCluster]
    k: int
    silhouette: float | None
    scores: dict[int, float]
    labels: list[int] = field(repr=False, default_factory=list)


SILHOUETTE_TOL = 0.05


def choose_k(
    x: np.ndarray, *, k_range: tuple[int, int] = (2, 6), seed: int = 0, tol: float = SILHOUETTE_TOL
) -> tuple[int, np.ndarray, dict[int, float]]:
    """K-means with the smallest k in ``k_range`` (inclusive) whose cosine silhouette is within ``tol`` of the best.

    Returns ``(k, labels, {k: silhouette})``; fewer than three distinct rows give ``k = 1``.
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    n_distinct = len(np.unique(np.round(x, 6), axis=0)) if len(x) else 0
    if n_distinct < 3:
        return 1, np.zeros(len(x), int), {}
    lo, hi = k_range
    scores: dict[int, float] = {}
    fits: dict[int, np.ndarray] = {}
    for k in range(max(2, lo), min(hi, n_distinct - 1) + 1):
        labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(x)
        if len(set(labels)) < 2:
            continue
        scores[k] = float(silhouette_score(x, labels, metric="cosine"))
        fits[k] = labels
    if not scores:
        return 1, np.zeros(len(x), int), scores
    best = max(scores.values())
    k = min(k for k, s in scores.items() if s >= best - tol)
    return k, fits[k], scores


def cluster_failures(
    records_by_policy: Mapping[str, Sequence[dict[str, Any]]],
    embedder: Embedder,
    *,
    k_range: tuple[int, int] = (2, 6),
    seed: int = 0,
) -> ClusterResult:
    """Cluster the failing turns of every policy by their embeddings (largest cluster first)."""
    items = failing_turns(records_by_policy)
    if not items:
        return ClusterResult([], 0, None, {})
    x = embedder.encode([it.text for it in items])
    k, labels, scores = choose_k(x, k_range=k_range, seed=seed)
    clusters = []
    for c in range(k):
        members = [i for i in range(len(items)) if labels[i] == c]
        if not members:
            continue
        centre = x[members].mean(0)
        rep = members[int(np.argmax(x[members] @ centre))]
        clusters.append(FailureCluster(
            index=c,
            size=len(members),
            episodes=len({id(items[i].record) for i in members}),
            by_policy=dict(Counter(items[i].policy for i in members)),
            top_errors=Counter(items[i].error for i in members).most_common(3),
            top_actions=Counter(items[i].action_type for i in members).most_common(3),
            example=items[rep],
        ))
    clusters.sort(key=lambda c: (-c.size, c.index))
    order = {c.index: new for new, c in enumerate(clusters)}
    for c in clusters:
        c.index = order[c.index]
    return ClusterResult(clusters, k, scores.get(k), scores, [order.get(int(lab), 0) for lab in labels])
