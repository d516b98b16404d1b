"""The evaluation report: one data structure, rendered to ``report.md`` and ``report.html``.

:func:`build_report` computes everything from per-policy episode records
(metrics with intervals, differences against a baseline with their tests,
success per level, reward terms, error patterns, decision trees, example
transcripts); :func:`report_blocks` lays it out once as a
:mod:`polyturn.eval.document` and :func:`write_report` renders that to
Markdown and (with figures) to a self-contained HTML page, so both files
always show the same numbers. docs/evaluation.md explains how to read it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyturn.eval import figures as F
from polyturn.eval import records as R
from polyturn.eval.clusters import ClusterResult, SignatureGroup, cluster_failures, signature_groups
from polyturn.eval.decision_tree import PolicyTree, fit_policy_tree, tree_png
from polyturn.eval.document import Block, Bullets, Code, Heading, Image, Para, Table, to_html, to_markdown, write_images
from polyturn.eval.embed import Embedder
from polyturn.eval.metrics import (
    METRICS,
    Comparison,
    MetricSpec,
    MetricValue,
    PolicyMetrics,
    coherence_scores,
    compare,
    compute_metrics,
    episode_stats,
    metrics_for,
)
from polyturn.eval.stats import sign_test


@dataclass
class ReportData:
    """Everything a report shows; both renderings are made from this alone."""

    title: str
    meta: dict[str, Any]
    policies: list[str]
    sources: dict[str, str]
    records: dict[str, list[dict[str, Any]]] = field(repr=False)
    values: dict[str, dict[str, MetricValue]]
    comparisons: list[Comparison]
    by_level: dict[str, dict[int, tuple[int, int]]]
    reward_terms: dict[str, dict[str, float]]
    turns: dict[str, list[int]]
    latencies: dict[str, list[float]]
    signatures: list[SignatureGroup]
    clusters: ClusterResult | None
    trees: dict[str, PolicyTree]
    #: per compared policy, success paired with the baseline's on the cases both ran
    paired: list[dict[str, Any]] = field(default_factory=list)
    #: the metrics shown: the generic ones, then the environments' own (:func:`metrics_for`)
    metric_specs: tuple[MetricSpec, ...] = METRICS

    def to_json(self) -> dict[str, Any]:
        """The numbers of the report (``metrics.json``)."""
        return {
            "title": self.title,
            "meta": self.meta,
            "policies": self.policies,
            "sources": self.sources,
            "definitions": {m.name: {"label": m.label, "group": m.group, "definition": m.definition, "test": m.test}
                            for m in self.metric_specs},
            "metrics": {p: {k: v.to_dict() for k, v in vals.items()} for p, vals in self.values.items()},
            "comparisons": [c.to_dict() for c in self.comparisons],
            "paired_success": self.paired,
            "success_by_level": {p: {str(lv): list(kn) for lv, kn in d.items()} for p, d in self.by_level.items()},
            "reward_terms": self.reward_terms,
            "failure_signatures": [{"signature": g.signature, "count": g.count, "by_policy": g.by_policy}
                                   for g in self.signatures],
            "failure_clusters": None if self.clusters is None else {
                "k": self.clusters.k, "silhouette": self.clusters.silhouette,
                "clusters": [{"size": c.size, "episodes": c.episodes, "by_policy": c.by_policy,
                              "description": c.description} for c in self.clusters.clusters]},
            "decision_trees": {p: {"accuracy": t.accuracy, "turns": t.n_samples, "rules": t.text}
                               for p, t in self.trees.items()},
            **({"subgoals": subgoals} if any((subgoals := {p: subgoal_stats(self.records[p])
                                                           for p in self.policies}).values()) else {}),
        }


def build_report(
    records: Mapping[str, Sequence[dict[str, Any]]],
    *,
    title: str = "polyturn evaluation",
    sources: Mapping[str, str] | None = None,
    meta: Mapping[str, Any] | None = None,
    embedder: Embedder | None = None,
    cluster_embedder: Embedder | None = None,
    baseline: str | None = None,
    compare_to: Sequence[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    tree_depth: int = 3,
) -> ReportData:
    """Compute a report from each policy's episode records (policies in the given order).

    ``embedder`` (MiniLM) gives coherence and, unless ``cluster_embedder`` is
    given, the embedding clusters; both are skipped when None. Differences are ``policy - baseline`` (default: the first policy)
    for each policy in ``compare_to`` (default: all others).
    """
    policies = list(records)
    if not policies:
        raise ValueError("Expected episode records of at least one policy, got none")
    baseline = baseline or policies[0]
    if baseline not in records:
        raise ValueError(f"Expected the baseline among the policies {policies}, got {baseline!r}")
    others = [p for p in (compare_to or policies) if p != baseline]
    unknown = [p for p in others if p not in records]
    if unknown:
        raise ValueError(f"Expected policies to compare among {policies}, got {unknown}")
    specs = metrics_for([r for p in policies for r in records[p]])
    pm: dict[str, PolicyMetrics] = {}
    for p in policies:
        recs = list(records[p])
        coh = coherence_scores(recs, embedder) if embedder is not None else [None] * len(recs)
        pm[p] = compute_metrics([episode_stats(r, coherence=c) for r, c in zip(recs, coh)], n_boot=n_boot, seed=seed,
                                metrics=specs)
    comparisons = [compare(spec, pm[baseline], pm[p], names=(baseline, p)) for p in others for spec in specs]
    paired_success = []
    for p in others:
        pairs = R.paired(records[baseline], records[p])
        if pairs:
            gained, lost = R.gained_lost(pairs)
            paired_success.append({"policy": p, "baseline": baseline, "cases": len(pairs), "gained": gained,
                                   "lost": lost, "p": sign_test(gained, lost)})
    by_level: dict[str, dict[int, tuple[int, int]]] = {}
    terms: dict[str, dict[str, float]] = {}
    for p in policies:
        lv: dict[int, list[int]] = {}
        tsum: dict[str, float] = {}
        for r in records[p]:
            kn = lv.setdefault(int(r.get("level", 0) or 0), [0, 0])
            kn[0] += R.is_success(r)
            kn[1] += 1
            for t in r.get("turns", []):
                for k, v in (t.get("reward_terms") or {}).items():
                    tsum[k] = tsum.get(k, 0.0) + float(v)
        by_level[p] = {k: (v[0], v[1]) for k, v in sorted(lv.items())}
        terms[p] = {k: v / max(1, len(records[p])) for k, v in sorted(tsum.items())}
    trees = {p: t for p in policies if (t := fit_policy_tree(records[p], max_depth=tree_depth, seed=seed)) is not None}
    return ReportData(
        title=title,
        meta=dict(meta or {}) | {"baseline": baseline},
        policies=policies,
        sources={p: (sources or {}).get(p, p) for p in policies},
        records={p: list(records[p]) for p in policies},
        values={p: pm[p].values for p in policies},
        comparisons=comparisons,
        by_level=by_level,
        reward_terms=terms,
        metric_specs=specs,
        turns={p: [len(r.get("turns", [])) for r in records[p]] for p in policies},
        latencies={p: [float(t["latency_s"]) for r in records[p] for t in r.get("turns", [])
                       if t.get("latency_s") is not None] for p in policies},
        signatures=signature_groups(records),
        clusters=cluster_failures(records, cluster_embedder or embedder, seed=seed)
        if (cluster_embedder or embedder) is not None else None,
        trees=trees,
        paired=paired_success,
    )


# ---- formatting: every number in both renderings goes through these ---------------------------
def fmt_num(v: float | None, kind: str = "float") -> str:
    """A metric number as shown in the report (``n/a`` when undefined)."""
    if v is None:
        return "n/a"
    if kind == "seconds":
        return f"{v:.4f}"
    if kind == "rate_per_s":
        return f"{v:.1f}"
    return f"{v:.3f}"


def fmt_p(p: float | None) -> str:
    """A p-value: three decimals, or ``<0.001``."""
    if p is None:
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_metric(spec: MetricSpec, v: MetricValue) -> str:
    """``value [lo, hi]`` (and ``k/n`` for episode proportions)."""
    s = fmt_num(v.value, spec.fmt)
    if v.value is not None and v.lo is not None and v.hi is not None:
        s += f" [{fmt_num(v.lo, spec.fmt)}, {fmt_num(v.hi, spec.fmt)}]"
    if v.count is not None:
        s += f" ({v.count[0]}/{v.count[1]})"
    return s


def _transcript_text(record: dict[str, Any], *, max_chars: int = 400) -> str:
    lines = []
    for role, text in R.transcript(record, max_chars=max_chars):
        label = {"user": "USER", "agent": "AGENT", "env": "ENV", "crash": "CRASH"}[role]
        lines.append(f"{label}: " + text.replace("\n", "\n" + " " * (len(label) + 2)))
    end = "success" if R.is_success(record) else ("crashed" if record.get("crashed") else "failure")
    lines.append(f"-- {end}, return {fmt_num(float(record.get('return', 0.0)))}")
    return "\n".join(lines)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z]+", "_", text).strip("_").lower() or "policy"


def report_blocks(data: ReportData, *, figures: bool) -> list[Block]:
    """The report's layout, shared by both renderings (figures only when ``figures``)."""
    m = data.meta
    b: list[Block] = [Heading(data.title, 1)]
    b.append(Para(f"Test cases: {m.get('test_cases', '-')} ({m.get('cases', '-')} cases). "
                  f"Decoding: {m.get('decoding', '-')}. Seed: {m.get('seed', '-')}. "
                  f"Baseline for differences: {m['baseline']}. How to read this report: docs/evaluation.md."))
    b.append(Table(("policy", "source", "episodes"),
                   tuple((p, data.sources[p], str(len(data.records[p]))) for p in data.policies)))

    b.append(Heading("Metrics"))
    b.append(Para("Value with its 95% interval (Wilson for episode proportions, Student-t for per-episode means, "
                  "jackknife over episodes for distinct-n, bootstrap over episodes otherwise); (k/n) counts episodes."))
    rows = [(spec.label, spec.group, *(fmt_metric(spec, data.values[p][spec.name]) for p in data.policies))
            for spec in data.metric_specs]
    b.append(Table(("metric", "group", *data.policies), tuple(rows)))

    by_name = {s.name: s for s in data.metric_specs}
    if data.comparisons:
        b.append(Heading(f"Differences against {m['baseline']}"))
        b.append(Para("Difference = policy - baseline. Tests: z = two-proportion z-test; welch = Welch's t-test; "
                      "jackknife = normal test with delete-one-episode jackknife standard errors; "
                      "bootstrap = unpaired bootstrap over episodes. Significant: two-sided p < 0.05."))
        rows = []
        for c in data.comparisons:
            spec = by_name[c.metric]
            diff = "n/a" if c.diff is None else ("+" if c.diff >= 0 else "") + fmt_num(c.diff, spec.fmt)
            rows.append((spec.label, c.policy, diff, fmt_p(c.p), c.test, "yes" if c.significant else "no"))
        b.append(Table(("metric", "policy", "difference", "p", "test", "significant"), tuple(rows)))
    if data.paired:
        b.append(Para(f"Success paired on the test cases both ran (the two-proportion test above ignores that they "
                      f"are the same tasks): the exact sign test (McNemar's) of the cases only the policy solved "
                      f"against those only {m['baseline']} solved."))
        b.append(Table(("policy", "cases", "solved only by the policy", f"solved only by {m['baseline']}", "p",
                        "significant"), tuple((d["policy"], str(d["cases"]), str(d["gained"]), str(d["lost"]),
                                               fmt_p(d["p"]), "yes" if d["p"] < 0.05 else "no") for d in data.paired)))

    b.append(Heading("Metric definitions"))
    b.append(Table(("metric", "definition", "test"),
                   tuple((s.label, s.definition, s.test) for s in data.metric_specs)))

    b.append(Heading("Success by difficulty level"))
    levels = sorted({lv for d in data.by_level.values() for lv in d})
    b.append(Table(("level", *data.policies), tuple(
        (str(lv), *(_rate_cell(data.by_level[p].get(lv)) for p in data.policies)) for lv in levels)))
    if figures:
        b.append(Image("success_by_level", "Figure: success rate by level and policy, 95% Wilson CI.",
                       F.success_by_level(data.by_level)))
        b.append(Image("turn_histograms", "Figure: agent turns per episode.", F.turn_histograms(data.turns)))

    b.append(Heading("Reward terms"))
    b.append(Para("Mean of each reward term per episode."))
    names = sorted({k for d in data.reward_terms.values() for k in d})
    b.append(Table(("term", *data.policies), tuple(
        (n, *(fmt_num(data.reward_terms[p].get(n, 0.0)) for p in data.policies)) for n in names)))
    if figures:
        b.append(Image("reward_terms", "Figure: reward-term breakdown, mean per episode.", F.reward_terms(data.reward_terms)))
        b.append(Image("latency", "Figure: per-turn latency distribution.", F.latency_distribution(data.latencies)))

    b += _subgoal_blocks(data)
    b += _error_blocks(data)
    b += _tree_blocks(data, figures=figures)
    b.append(Heading("Transcripts"))
    for p in data.policies:
        for want, label in ((True, "success"), (False, "failure")):
            rec = next((r for r in data.records[p] if R.is_success(r) == want), None)
            if rec is not None:
                b.append(Heading(f"{p}: a {label} (case {R.case_key(rec)})", 3))
                b.append(Code(_transcript_text(rec)))
    return b


def _rate_cell(kn: tuple[int, int] | None) -> str:
    if not kn or kn[1] == 0:
        return "-"
    return f"{fmt_num(kn[0] / kn[1])} ({kn[0]}/{kn[1]})"


def subgoal_stats(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """A hierarchical worker's subgoals (docs/hierarchy.md) in ``records``: per subgoal name, the episodes it was set
    in, its worker turns per such episode, and the share of them in which it was reached (its intrinsic reward
    paid); empty for a flat agent's records."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        turns: dict[str, int] = {}
        reached: set[str] = set()
        for t in r.get("turns", []):
            name = (t.get("info") or {}).get("subgoal")
            if name is None:
                continue
            turns[name] = turns.get(name, 0) + 1
            if (t.get("reward_terms") or {}).get("intrinsic/subgoal", 0.0) > 0:
                reached.add(name)
        for name, n in turns.items():
            d = out.setdefault(name, {"episodes": 0.0, "turns": 0.0, "reached": 0.0})
            d["episodes"] += 1
            d["turns"] += n
            d["reached"] += name in reached
    return {k: {"episodes": d["episodes"], "turns_per_episode": d["turns"] / d["episodes"],
                "reached": d["reached"] / d["episodes"]} for k, d in out.items()}


def _subgoal_blocks(data: ReportData) -> list[Block]:
    stats = {p: subgoal_stats(data.records[p]) for p in data.policies}
    names = sorted({k for d in stats.values() for k in d})
    if not names:
        return []
    b: list[Block] = [Heading("Subgoals"), Para(
        "A hierarchical agent's subgoals (docs/hierarchy.md): per subgoal its manager set, the episodes it was set in, "
        "the worker's turns on it per such episode, and the share of them in which it was reached (the env's check "
        "held, paying the worker's intrinsic reward; an unchecked subgoal is never counted reached).")]
    rows = []
    for p in data.policies:
        for n in names:
            d = stats[p].get(n)
            if d:
                rows.append((p, n, str(int(d["episodes"])), fmt_num(d["turns_per_episode"]), fmt_num(d["reached"])))
    return b + [Table(("policy", "subgoal", "episodes", "worker turns / episode", "reached"), tuple(rows))]


def _error_blocks(data: ReportData) -> list[Block]:
    b: list[Block] = [Heading("Error patterns")]
    if not data.signatures:
        return b + [Para("No failed episodes.")]
    b.append(Para("Failure signatures: how the episode ended, the last error kind, and the expected key actions "
                  "never performed."))
    b.append(Table(("signature", "episodes", *data.policies), tuple(
        (g.signature, str(g.count), *(str(g.by_policy.get(p, 0)) for p in data.policies))
        for g in data.signatures[:12])))
    cr = data.clusters
    if cr is None or not cr.clusters:
        return b
    sil = "n/a" if cr.silhouette is None else fmt_num(cr.silhouette)
    b.append(Para(f"Embedding clusters of the failing turns (k-means on sentence embeddings of each failing action "
                  f"and the env's answer): k = {cr.k}, the smallest k in 2..6 whose silhouette is within 0.05 of the "
                  f"best (silhouette {sil})."))
    b.append(Table(("cluster", "turns", "episodes", "pattern", *data.policies), tuple(
        (str(c.index), str(c.size), str(c.episodes), c.description, *(str(c.by_policy.get(p, 0)) for p in data.policies))
        for c in cr.clusters)))
    for c in cr.clusters[:6]:
        ex = c.example
        b.append(Heading(f"Cluster {c.index}: example from {ex.policy} (case {R.case_key(ex.record)}, turn {ex.turn})", 3))
        b.append(Code(_transcript_text(ex.record, max_chars=250)))
    return b


def _tree_blocks(data: ReportData, *, figures: bool) -> list[Block]:
    b: list[Block] = [Heading("Policy decision trees")]
    b.append(Para("A depth-limited decision tree fitted from interpretable state features to the action type the "
                  "policy chose next; accuracy is how often the tree reproduces the policy on these turns."))
    for i, (p, t) in enumerate(data.trees.items()):
        b.append(Heading(f"{p}", 3))
        b.append(Bullets((f"turns: {t.n_samples}", f"tree accuracy: {fmt_num(t.accuracy)}")))
        b.append(Code(t.text.rstrip()))
        if figures:
            b.append(Image(f"tree_{i}_{_slug(p)}", f"Figure: decision tree of {p}.", tree_png(t, title=p)))
    return b


def write_report(data: ReportData, out_dir: str | Path, *, visualize: bool) -> dict[str, Path]:
    """Write ``report.md`` and ``metrics.json``; with ``visualize`` also ``figures/*.png`` and ``report.html``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    blocks = report_blocks(data, figures=visualize)
    paths = {"markdown": out / "report.md", "metrics": out / "metrics.json"}
    paths["markdown"].write_text(to_markdown(blocks), encoding="utf-8")
    paths["metrics"].write_text(json.dumps(data.to_json(), indent=2, ensure_ascii=False), encoding="utf-8")
    if visualize:
        write_images(blocks, out / "figures")
        paths["html"] = out / "report.html"
        paths["html"].write_text(to_html(blocks, title=data.title), encoding="utf-8")
    return paths
