"""Each metric on hand-made episodes with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from polyturn.eval import records as R
from polyturn.eval.metrics import (
    METRIC_BY_NAME,
    METRICS,
    coherence_scores,
    compare,
    compute_metrics,
    distinct_n,
    episode_stats,
    repeated_actions,
)


def metrics_of(records, **kw):
    return compute_metrics([episode_stats(r) for r in records], n_boot=200, **kw).values


def test_every_metric_has_a_one_line_definition_and_a_test():
    for m in METRICS:
        assert m.definition and "\n" not in m.definition
        assert m.test in ("z", "welch", "bootstrap", "jackknife")
    assert len({m.name for m in METRICS}) == len(METRICS)


def test_distinct_n_by_hand():
    actions = ["run sql now", "run sql later"]
    # unigrams: run sql now run sql later -> 4 unique / 6; bigrams: (run sql)(sql now)(run sql)(sql later) -> 3 / 4
    assert distinct_n(actions, 1) == pytest.approx(4 / 6)
    assert distinct_n(actions, 2) == pytest.approx(3 / 4)
    # n-grams do not cross actions: "a" + "b" has no bigram at all
    assert distinct_n(["a", "b"], 2) is None


def test_distinct_metric_pools_over_episodes(ep):
    r1 = ep.record([ep.turn("run sql now", "invalid")], case_id="a")
    r2 = ep.record([ep.turn("run sql later", "invalid")], case_id="b")
    v = metrics_of([r1, r2])
    assert v["distinct_1"].value == pytest.approx(4 / 6)
    assert v["distinct_2"].value == pytest.approx(3 / 4)
    assert v["distinct_1"].lo <= v["distinct_1"].value <= v["distinct_1"].hi


def test_key_action_accuracy_maps_inspect_schema_and_counts_multisets(ep):
    keys = ["inspect_schema", "ask_user", "run_sql", "run_sql", "submit_answer"]
    turns = [
        ep.turn("Action: describe_table[...]", "describe_table"),  # inspect_schema via describe_table
        ep.turn("Action: run_sql[...]", "run_sql", error="sql_error"),  # performed (valid call, tool error)
        ep.turn("Action: ask[...]", "invalid", error="unknown_tool"),  # invalid: does not count as ask_user
        ep.turn("Action: submit_answer[...]", "submit_answer"),
    ]
    rec = ep.record(turns, key_actions=keys)
    # matched: inspect_schema 1, run_sql 1 of 2, submit_answer 1, ask_user 0 -> 3 of 5
    assert R.key_action_hits(rec) == (3, 5)
    assert R.missing_key_actions(rec) == ["ask_user", "run_sql"]
    assert metrics_of([rec])["key_action_accuracy"].value == pytest.approx(3 / 5)
    # The test case's expected key actions win over the env's.
    rec["expected_key_actions"] = ["inspect_schema", "submit_answer"]
    assert R.key_action_hits(rec) == (2, 2)


def test_error_invalid_and_repetition_rates(ep):
    turns = [
        ep.turn("Action: list_tables[{}]", "list_tables"),
        ep.turn("Action: list_tables[{}]", "list_tables", error="repeat"),  # error, valid, repeated
        ep.turn("garbage", "invalid", error="format"),  # error, invalid
        ep.turn(" Action: list_tables[{}] ", "list_tables", error="repeat"),  # repeated (whitespace ignored)
    ]
    v = metrics_of([ep.record(turns)])
    assert v["error_response_rate"].value == pytest.approx(3 / 4)
    assert v["invalid_action_rate"].value == pytest.approx(1 / 4)
    assert v["repetition_rate"].value == pytest.approx(2 / 4)
    assert repeated_actions(["a", "b", "a", "c", "b"]) == 2


def test_success_rate_has_a_wilson_interval_and_turns_count_successes_only(ep):
    recs = [ep.expert_like(f"s{i}") for i in range(8)]  # 4 turns each, successful
    recs += [ep.record([ep.turn("x", "invalid")] * 7, case_id=f"f{i}") for i in range(2)]  # failures, 7 turns
    v = metrics_of(recs)
    s = v["success_rate"]
    assert s.value == pytest.approx(0.8) and s.count == (8, 10)
    assert (s.lo, s.hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert v["turns_to_success"].value == pytest.approx(4.0)


def test_latency_percentiles_and_tokens_per_second(ep):
    lat = [0.01 * k for k in range(1, 101)]  # 0.01 .. 1.00 s
    turns = [ep.turn(f"a{k}", "run_sql", latency=x, n_tokens=10) for k, x in enumerate(lat)]
    v = metrics_of([ep.record(turns)])
    assert v["latency_p50"].value == pytest.approx(np.percentile(lat, 50))
    assert v["latency_p95"].value == pytest.approx(np.percentile(lat, 95))
    assert v["latency_p99"].value == pytest.approx(0.9901)
    assert v["tokens_per_s"].value == pytest.approx(1000 / sum(lat))
    # Batched actors record each turn's share of its decode step (gen_s): throughput uses it, latency does not.
    shared = [dict(t, gen_s=0.001) for t in turns]
    v = metrics_of([ep.record(shared)])
    assert v["tokens_per_s"].value == pytest.approx(1000 / 0.1)
    assert v["latency_p50"].value == pytest.approx(np.percentile(lat, 50))
    # Text policies record no token counts: tokens/s is undefined, not zero.
    assert metrics_of([ep.record([ep.turn("a", "run_sql")])])["tokens_per_s"].value is None


def test_crashed_and_tool_timeout_episodes(ep):
    recs = [ep.record([], crashed=True, case_id="x"),
            ep.record([ep.turn("Action: run_sql[...]", "run_sql", error="sql_timeout")], case_id="y"),
            ep.expert_like("z")]
    v = metrics_of(recs)
    assert v["crash_rate"].count == (1, 3)
    assert v["tool_timeout_rate"].count == (1, 3)
    assert not R.is_success({**ep.expert_like("w"), "crashed": True})  # a crash never counts as a success


def test_coherence_prefers_a_relevant_reply(ep, minilm):
    question = "Which 3 products had the highest revenue in East China in 2024-Q3?"
    good = ep.record([ep.turn('run_sql: SELECT product, SUM(revenue) FROM sales WHERE zone = "East China" '
                              'GROUP BY product ORDER BY 2 DESC LIMIT 3', "run_sql")], question=question)
    bad = ep.record([ep.turn("I like to play football with my dog on sunny afternoons.", "invalid")],
                    question=question)
    (g,), (b,) = coherence_scores([good, bad], minilm)
    assert -1.0 <= b < g <= 1.0
    assert g - b > 0.15


def test_compare_flags_a_clear_success_difference_only(ep):
    good = compute_metrics([episode_stats(ep.expert_like(f"g{i}")) for i in range(30)], n_boot=200)
    bad = compute_metrics([episode_stats(ep.expert_like(f"b{i}", success=i < 5)) for i in range(30)], n_boot=200)
    same = compute_metrics([episode_stats(ep.expert_like(f"s{i}")) for i in range(30)], n_boot=200)
    spec = METRIC_BY_NAME["success_rate"]
    c = compare(spec, good, bad, names=("good", "bad"))
    assert c.test == "z" and c.diff == pytest.approx(5 / 30 - 1) and c.significant
    assert not compare(spec, good, same, names=("good", "same")).significant


def test_docs_define_every_metric_and_warning():
    from pathlib import Path

    from polyturn.health.checks import REMEDIES

    docs = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    for m in METRICS:
        assert f"| {m.label} | {m.group} |" in docs, m.label
    for kind in REMEDIES:
        assert kind.replace("_", " ") in docs, kind
