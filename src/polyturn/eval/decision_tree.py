"""Policy decision-tree visualisation (seed 001, 5.2): what the agent does next, in readable rules.

A shallow :class:`sklearn.tree.DecisionTreeClassifier` is fitted from
interpretable features of the state before each turn to the action type the
agent chose. The tree is a *surrogate*: it explains the policy's behaviour on
the evaluated episodes (its training accuracy says how faithfully), not the
network's internals.

State features before turn t (:func:`state_features`):

* ``turn`` — the turn index t (0 = first action);
* ``ambiguous`` — the task was ambiguous (the agent should ask);
* ``level`` — task difficulty;
* ``errors_so_far`` — earlier turns with an error;
* ``used_<tool>`` — 1 if an earlier valid action used that tool (the tools
  of the records' environments, their specs' ``action_types``);
* ``last_obs_<kind>`` — one-hot kind of the observation the action answers:
  ``task`` (the request), ``error``, the kinds the env's spec names
  (``observation_kinds``: for the SQL analyst ``rows``, ``user_reply``,
  ``schema``), ``other``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyturn.eval import records as R

BASE_FEATURES = ("turn", "ambiguous", "level", "errors_so_far")


def feature_names(records: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The features of ``records``: the base ones, ``used_<tool>`` and ``last_obs_<kind>`` of their envs' specs."""
    tools: dict[str, None] = {}
    kinds: dict[str, None] = {"task": None, "error": None}
    for env_id in dict.fromkeys(str(r.get("env_id")) for r in records):
        spec = R.env_spec_of({"env_id": env_id})
        if spec is not None:
            tools |= dict.fromkeys(spec.action_types)
            kinds |= dict.fromkeys(spec.observation_kinds.values())
    for rec, _, turn in R.iter_turns(records):  # tools an unregistered env's records show
        if R.is_valid(turn):
            tools.setdefault(R.action_type(turn), None)
    kinds["other"] = None
    return (*BASE_FEATURES, *(f"used_{t}" for t in tools), *(f"last_obs_{k}" for k in kinds))


def observation_kind(record: dict[str, Any], t: int) -> str:
    """The kind of observation turn ``t`` answers (see the module docstring)."""
    if t == 0:
        return "task"
    prev = record["turns"][t - 1]
    if R.turn_error(prev):
        return "error"
    spec = R.env_spec_of(record)
    return spec.observation_kinds.get(R.action_type(prev), "other") if spec is not None else "other"


def state_features(record: dict[str, Any], t: int) -> dict[str, float]:
    """The interpretable features of the state before turn ``t`` (a feature absent here counts as 0)."""
    before = record.get("turns", [])[:t]
    used = {R.action_type(x) for x in before if R.is_valid(x)}
    kind = observation_kind(record, t)
    out = {
        "turn": float(t),
        "ambiguous": float(bool(record.get("ambiguous"))),
        "level": float(record.get("level", 0) or 0),
        "errors_so_far": float(sum(R.turn_error(x) is not None for x in before)),
    }
    spec = R.env_spec_of(record)
    tools = (*(spec.action_types if spec is not None else ()), *sorted(used))
    kinds = ("task", "error", *(spec.observation_kinds.values() if spec is not None else ()), "other", kind)
    out |= {f"used_{tool}": float(tool in used) for tool in tools}
    out |= {f"last_obs_{k}": float(k == kind) for k in kinds}
    return out


@dataclass
class PolicyTree:
    """A fitted surrogate tree: the model, its rules as text, and how faithful it is."""

    model: Any = field(repr=False)
    feature_names: list[str]
    classes: list[str]
    text: str
    accuracy: float
    n_samples: int

    def predict(self, features: Sequence[dict[str, float]]) -> list[str]:
        """Predicted action types for feature dicts (missing keys count as 0)."""
        x = np.array([[f.get(k, 0.0) for k in self.feature_names] for f in features])
        return [str(c) for c in self.model.predict(x)]


def tree_dataset(records: Sequence[dict[str, Any]]) -> tuple[np.ndarray, list[str], list[str]]:
    """``(X [turns, features], y action types, feature names)`` over every turn of ``records``."""
    names = feature_names(records)
    rows, labels = [], []
    for rec, t, turn in R.iter_turns(records):
        f = state_features(rec, t)
        rows.append([f.get(k, 0.0) for k in names])
        labels.append(R.action_type(turn))
    return np.array(rows, float).reshape(len(rows), len(names)), labels, list(names)


def fit_policy_tree(
    records: Sequence[dict[str, Any]], *, max_depth: int = 3, min_samples_leaf: int = 2, seed: int = 0
) -> PolicyTree | None:
    """Fit the surrogate tree on every turn of ``records``; None when there are no turns."""
    from sklearn.tree import DecisionTreeClassifier, export_text

    x, y, names = tree_dataset(records)
    if len(y) == 0:
        return None
    model = DecisionTreeClassifier(max_depth=max_depth, min_samples_leaf=min_samples_leaf, random_state=seed)
    model.fit(x, y)
    text = export_text(model, feature_names=names, decimals=1)
    acc = float((model.predict(x) == np.array(y)).mean())
    return PolicyTree(model, names, [str(c) for c in model.classes_], text, acc, len(y))


def tree_png(tree: PolicyTree, *, title: str = "") -> bytes:
    """The tree drawn with :func:`sklearn.tree.plot_tree`, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.tree import plot_tree

    depth = max(1, tree.model.get_depth())
    fig, ax = plt.subplots(figsize=(min(22, 4 + 3.2 * 2 ** min(depth, 3)), 1.8 + 1.8 * depth))
    plot_tree(tree.model, feature_names=tree.feature_names, class_names=tree.classes, filled=True,
              impurity=False, proportion=False, rounded=True, fontsize=8, ax=ax)
    if title:
        ax.set_title(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
