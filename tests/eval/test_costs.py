"""Cost terms in evaluation: a metric per cost term the records carry (mean per episode), in the report with its
interval and its difference against the baseline; none for records without cost terms."""

from __future__ import annotations

import json

import pytest

from polyturn.eval.metrics import METRICS, compute_metrics, cost_metric_specs, episode_stats, metrics_for
from polyturn.eval.report import build_report, write_report


def _with_costs(record: dict, per_turn: list[tuple[float, float]]) -> dict:
    """``record`` as CustomerService writes it: each turn's violation and error-response costs."""
    for t, (v, e) in zip(record["turns"], per_turn):
        t["cost_terms"] = {"cost/violation": v, "cost/error_response": e}
    return record


def test_a_metric_per_cost_term_the_records_carry(ep):
    recs = [_with_costs(ep.expert_like(f"c{i}"), [(1.0 if i < 2 else 0.0, 1.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)])
            for i in range(4)]
    specs = cost_metric_specs(recs)
    assert [(s.name, s.group, s.higher_is_better) for s in specs] == [("cost/violation", "cost", False),
                                                                      ("cost/error_response", "cost", False)]
    assert episode_stats(recs[0]).costs == {"cost/violation": 1.0, "cost/error_response": 1.0}
    values = compute_metrics([episode_stats(r) for r in recs], n_boot=50, metrics=specs).values
    assert values["cost/violation"].value == pytest.approx(0.5) and values["cost/error_response"].value == 1.0
    assert [m.name for m in metrics_for(recs)][-2:] == ["cost/violation", "cost/error_response"]
    plain = [ep.expert_like("c0")]
    assert cost_metric_specs(plain) == () and [m.name for m in metrics_for(plain)] == [m.name for m in METRICS]


def test_the_report_shows_each_cost_term_and_its_difference(ep, tmp_path):
    costly = [_with_costs(ep.expert_like(f"c{i}"), [(1.0, 1.0), (0.0, 1.0), (0.0, 0.0), (0.0, 0.0)])
              for i in range(10)]
    clean = [_with_costs(ep.expert_like(f"c{i}"), [(0.0, 0.0)] * 4) for i in range(10)]
    data = build_report({"costly": costly, "clean": clean}, n_boot=50)
    assert data.values["costly"]["cost/error_response"].value == 2.0
    assert data.values["clean"]["cost/violation"].value == 0.0
    diff = next(c for c in data.comparisons if c.metric == "cost/violation")
    assert diff.diff == pytest.approx(-1.0) and diff.test == "welch"
    md = write_report(data, tmp_path, visualize=False)["markdown"].read_text()
    assert "| Cost violation | cost | 1.000" in md and "| Cost error_response | cost | 2.000" in md
    assert "cost/violation" in json.loads((tmp_path / "metrics.json").read_text())["metrics"]["clean"]
