"""diagnose's held-out comparison reports the env spec's own metrics and breakdowns: CustomerService by intent."""

from __future__ import annotations

from collections import Counter

from polyturn.acting.episodes import generate_demos
from polyturn.envs.customer_service.goals import INTENTS, make_goal
from polyturn.eval.held_out import compare_evaluations, held_out_blocks
from polyturn.eval.document import to_markdown

CS = "polyturn/CustomerService-v0"


def test_customer_service_success_by_intent_and_error_responses():
    before = list(generate_demos(CS, episodes=60, noise=0.3, seed=0))  # the noisy expert as "bc"
    after = list(generate_demos(CS, episodes=60, noise=0.0, seed=0))  # the exact expert as "final": same tasks
    c = compare_evaluations(before, after, tags=("bc", "final"))
    assert c is not None and c.episodes == 60
    # The intent of each task, from the goal the env draws for its seed (not from the record's text).
    intent = {r["seed"]: make_goal(r["seed"], None)[1].intent for r in before}
    tasks = Counter(intent.values())
    solved_before = Counter(intent[r["seed"]] for r in before if r["success"])
    solved_after = Counter(intent[r["seed"]] for r in after if r["success"])
    rows = {g: (n, s0, s1) for g, n, s0, s1 in c.groups["intent"]}
    assert set(rows) == set(tasks) <= set(INTENTS) and len(rows) >= 5
    assert rows == {g: (tasks[g], solved_before[g], solved_after[g]) for g in tasks}
    assert sum(n for n, _, _ in rows.values()) == 60 and all(s1 == n for n, _, s1 in rows.values())
    # Seed 001's error responses: steps whose step reported an error, per episode.
    errors = [sum(t["info"]["error"] is not None for t in r["turns"]) for r in before]
    eb, ea = c.env_metrics["error_responses"]
    assert abs(eb - sum(errors) / 60) < 1e-9 and eb > 0 and ea == 0.0
    md = to_markdown(held_out_blocks([c]))
    assert "| intent | tasks | solved (bc) | solved (final) |" in md and "error_responses" in md
