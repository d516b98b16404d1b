"""What evaluation knows of an environment comes from its EnvSpec: failure names, key actions, timeouts, metrics."""

from __future__ import annotations

from polyturn.eval import records as R
from polyturn.eval.clusters import failure_signature
from polyturn.eval.decision_tree import feature_names, state_features
from polyturn.eval.metrics import METRICS, episode_stats, metrics_for

NEG = "polyturn/Negotiation-v0"


def as_env(record: dict, env_id: str) -> dict:
    return dict(record, env_id=env_id)


def test_failure_endings_follow_the_spec(ep):
    walk = as_env(ep.record([ep.turn('Action: propose[{"books": 1}]', "propose"),
                             ep.turn("Action: walk_away[{}]", "walk_away")], key_actions=["propose", "accept"]), NEG)
    assert failure_signature(walk) == "ended_by(walk_away) | last_error=none | missing=accept"
    cut = as_env(ep.record([ep.turn('Action: propose[{"books": 1}]', "propose")], key_actions=[]), NEG)
    cut["turns"][-1].update(terminated=False, truncated=True)
    assert failure_signature(cut).startswith("turn_limit | ")
    guess = as_env(ep.record([ep.turn('Action: guess[{"object": "cat"}]', "guess")], key_actions=[]),
                   "polyturn/TwentyQuestions-v0")
    assert failure_signature(guess).startswith("wrong_guess | ")
    # An env id nobody registered is still evaluated, generically.
    assert failure_signature(as_env(walk, "someone/Gone-v0")).startswith("ended_by(walk_away) | ")


def test_key_actions_map_through_the_spec(ep):
    rec = ep.expert_like("c0")
    assert R.key_action_hits(rec) == (3, 3)  # inspect_schema is performed by describe_table (the SQL spec)
    other = as_env(rec, NEG)  # Negotiation's spec has no inspect_schema: only an action of that name performs it
    assert R.missing_key_actions(other) == ["inspect_schema"]


def test_tool_timeouts_are_the_error_kinds_the_spec_names(ep):
    rec = ep.record([ep.turn('Action: run_sql[{"sql": "x"}]', "run_sql", error="sql_timeout")])
    assert episode_stats(rec).tool_timeout
    assert not episode_stats(as_env(rec, NEG)).tool_timeout


def test_env_metrics_come_from_the_records_envs(ep):
    turn = ep.turn("Action: accept[{}]", "accept")
    turn["info"]["features"] = {"deal": 1.0, "deal_worth": 0.6}
    neg = as_env(ep.record([turn], success=True), NEG)
    names = [m.name for m in metrics_for([neg])]
    assert names[: len(METRICS)] == [m.name for m in METRICS] and names[len(METRICS):] == ["deal_rate", "deal_worth"]
    assert episode_stats(neg).env_values == {"deal_rate": 1.0, "deal_worth": 0.6}
    sql = metrics_for([ep.expert_like("c0")])
    assert [m.name for m in sql] == [m.name for m in METRICS]  # the SQL analyst adds none
    assert "list_tables or describe_table" in next(m for m in sql if m.name == "key_action_accuracy").definition


def test_decision_tree_features_are_the_envs_tools(ep):
    neg = as_env(ep.record([ep.turn('Action: propose[{"books": 1}]', "propose")]), NEG)
    names = feature_names([neg])
    assert "used_propose" in names and "used_run_sql" not in names and "last_obs_user_reply" in names
    assert set(state_features(neg, 0)) <= set(names) | {"used_remember"}
