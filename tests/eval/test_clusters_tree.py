"""Failure clustering and the policy decision tree recover known structure in synthetic episodes."""

from __future__ import annotations

import numpy as np
import pytest

from polyturn.eval.clusters import choose_k, cluster_failures, failure_signature, signature_groups
from polyturn.eval.decision_tree import fit_policy_tree, state_features, tree_png
from polyturn.eval.embed import TfidfEmbedder


def sql_failure(ep, i: int):
    """Fails on SQL errors (a misspelt table), then never answers."""
    sql = f"SELECT SUM({['revenue', 'units'][i % 2]}) FROM sale WHERE year = {2000 + i}"
    turns = [ep.turn(f'Action: run_sql[{{"sql": "{sql}"}}]', "run_sql", error="sql_error",
                     after="SQL error: no such table: sale")]
    return ep.record(turns, case_id=f"sql{i}")


def format_failure(ep, i: int):
    """Fails on unparseable chatter."""
    text = ["Sure! I would be happy to help you with that question today.",
            "Hello there, let me think about how to approach this nicely.",
            "Of course, I can certainly help with your request, my friend.",
            "Great question! Give me a moment to look into it for you.",
            "Thanks for asking, I will gladly find that out for you.",
            "Absolutely, happy to assist you with this one right away."][i % 6]
    turns = [ep.turn(text, "invalid", error="format", after="Format error (no_action): write Action: tool[{...}]")]
    return ep.record(turns, case_id=f"fmt{i}")


def test_failure_signatures(ep):
    wrong = ep.expert_like("w", success=False)
    assert failure_signature(wrong) == "wrong_answer(number) | last_error=none | missing=none"
    sqlf = sql_failure(ep, 0)
    assert failure_signature(sqlf) == "no_answer | last_error=sql_error | missing=inspect_schema,submit_answer"
    crash = ep.record([], crashed=True)
    assert failure_signature(crash).startswith("crash | ")
    groups = signature_groups({"a": [sql_failure(ep, i) for i in range(3)] + [ep.expert_like("ok")],
                               "b": [sql_failure(ep, 9), wrong]})
    assert [(g.count, g.by_policy) for g in groups] == [(4, {"a": 3, "b": 1}), (1, {"b": 1})]


@pytest.mark.parametrize("embedder", ["minilm", "tfidf"])
def test_two_kinds_of_failure_give_two_clusters(ep, minilm, embedder):
    emb = minilm if embedder == "minilm" else TfidfEmbedder()
    recs = {"p": [sql_failure(ep, i) for i in range(6)] + [format_failure(ep, i) for i in range(6)]
            + [ep.expert_like("ok")]}
    res = cluster_failures(recs, emb)
    assert res.k == 2
    truth = ["sql" if r["case_id"].startswith("sql") else "fmt" for r in recs["p"][:12]]
    # The recovered partition equals the true one (up to label names).
    pairs = {(t, lab) for t, lab in zip(truth, res.labels)}
    assert len(pairs) == 2
    assert sorted(c.size for c in res.clusters) == [6, 6]
    descriptions = {c.description for c in res.clusters}
    assert any("sql_error" in d for d in descriptions) and any("format" in d for d in descriptions)
    assert all(c.example.record["case_id"][:3] in ("sql", "fmt") for c in res.clusters)


def test_choose_k_picks_the_number_of_blobs():
    rng = np.random.default_rng(0)
    centres = np.eye(3) * 5
    x = np.concatenate([c + 0.1 * rng.standard_normal((10, 3)) for c in centres])
    k, labels, scores = choose_k(x, k_range=(2, 6))
    assert k == 3 and len(set(labels[:10])) == 1 and len(set(labels)) == 3
    assert scores[3] > scores[2]
    assert choose_k(np.ones((5, 3)))[0] == 1  # identical failures: one cluster


def rule_policy_episodes(ep, n: int = 24):
    """Known rule: ask_user first when ambiguous; otherwise inspect, query, answer."""
    out = []
    for i in range(n):
        amb = i % 2 == 0
        out.append(ep.expert_like(f"e{i}", ambiguous=amb, level=1 + i % 3))
        if amb:  # move ask_user to the front
            turns = out[-1]["turns"]
            ask = next(t for t in turns if t["info"]["action_type"] == "ask_user")
            rest = [t for t in turns if t is not ask]
            rebuilt = [dict(ask, _after="Revenue.")] + [dict(t, _after="ok") for t in rest]
            out[-1] = ep.record([{k: v for k, v in t.items() if k != "observation"} for t in rebuilt],
                                success=True, ambiguous=True, case_id=f"e{i}")
    return out


def test_decision_tree_recovers_ask_user_first_when_ambiguous(ep):
    recs = rule_policy_episodes(ep)
    tree = fit_policy_tree(recs, max_depth=5)
    assert tree is not None and tree.accuracy == 1.0
    assert "ambiguous" in tree.text
    start = {"turn": 0.0, "last_obs_task": 1.0}  # a feature left out counts as 0
    assert tree.predict([start | {"ambiguous": 1.0}, start | {"ambiguous": 0.0}]) == ["ask_user", "list_tables"]
    png = tree_png(tree, title="rule")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_state_features(ep):
    rec = ep.record([ep.turn("Action: list_tables[{}]", "list_tables"),
                     ep.turn("x", "invalid", error="format"),
                     ep.turn("Action: run_sql[...]", "run_sql")], ambiguous=True)
    f0, f2 = state_features(rec, 0), state_features(rec, 2)
    assert f0["last_obs_task"] == 1.0 and f0["used_list_tables"] == 0.0 and f0["ambiguous"] == 1.0
    assert f2["turn"] == 2.0 and f2["last_obs_error"] == 1.0 and f2["used_list_tables"] == 1.0
    assert f2["errors_so_far"] == 1.0 and f2["used_run_sql"] == 0.0
