"""Episode records: what a rollout turn says about validity matches what the saved record says."""

import pytest

from polyturn.eval.records import is_valid
from polyturn.rollout.types import Episode, Turn


def _turn(info: dict) -> Turn:
    return Turn(observation="obs", action="act", action_ids=[1, 2], logprobs=[-0.1, -0.2], reward=0.0,
                reward_terms={}, terminated=False, truncated=False, info=info, privileged="", features={})


@pytest.mark.parametrize("info, valid", [
    ({"action_valid": False, "action_type": "tool"}, False),
    ({"action_valid": True, "action_type": "invalid"}, True),  # the env's own flag wins
    ({"action_type": "invalid"}, False),  # no flag: an invalid action type is invalid
    ({"action_type": "tool"}, True),
    ({}, True),
])
def test_a_turn_and_its_saved_record_agree_on_validity(info, valid):
    turn = _turn(info)
    ep = Episode(env_id="polyturn/SQLAnalyst-v0", seed=1, task_id="t", question="q", level=1, ambiguous=False,
                 key_actions=[], turns=[turn])
    record = ep.to_record()["turns"][0]
    assert turn.valid is valid
    assert is_valid(record) is valid


def test_costs_sum_per_term_and_records_keep_them_only_when_reported():
    ep = Episode(env_id="polyturn/CustomerService-v0", seed=1, task_id="t", question="q", level=1, ambiguous=False,
                 key_actions=[], turns=[_turn({}), _turn({})])
    ep.turns[0].cost_terms = {"cost/violation": 1.0, "cost/error_response": 1.0}
    ep.turns[1].cost_terms = {"cost/violation": 0.0, "cost/error_response": 1.0}
    assert ep.costs == {"cost/violation": 1.0, "cost/error_response": 2.0}
    turns = ep.to_record()["turns"]
    assert turns[1]["cost_terms"] == {"cost/violation": 0.0, "cost/error_response": 1.0}
    assert list(turns[0])[:5] == ["observation", "action", "reward", "reward_terms", "cost_terms"]
    plain = Episode(env_id="polyturn/TwentyQuestions-v0", seed=1, task_id="t", question="q", level=1,
                    ambiguous=False, key_actions=[], turns=[_turn({})])
    assert plain.costs == {} and "cost_terms" not in plain.to_record()["turns"][0]
