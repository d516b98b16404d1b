"""Reward terms: weights config, each env's own terms, each term paid when it should be, and never for a repeat."""

from __future__ import annotations

import doctest
import math

import pytest
from pydantic import ValidationError

import polyturn.envs.rewards as rewards_module
from polyturn.acting.registry import make_env
from polyturn.envs.actions import format_action
from polyturn.envs.base import EpisodeStart, ToolEnv, ToolResult
from polyturn.envs.customer_service.env import CustomerServiceWeights
from polyturn.envs.rewards import RewardWeights, StepEvents, reward_terms
from polyturn.envs.sql.env import SQLAnalystEnv, SQLAnalystWeights

GENERIC = ["outcome/success", "outcome/failure", "outcome/timeout", "process/well_formed", "process/valid_call",
           "penalty/unparseable", "penalty/invalid_call", "penalty/repeat", "penalty/turn_cost"]
ALL_TERMS = set(SQLAnalystWeights().terms())  # what an SQL env reports
POSITIVE = {"process/well_formed", "process/valid_call"}


def test_defaults_and_term_names() -> None:
    terms = SQLAnalystWeights().terms()
    assert terms["outcome/success"] == 10.0 and terms["outcome/failure"] == -5.0
    assert terms["outcome/timeout"] == -5.0
    assert terms["subgoal/schema_inspected"] == 0.2 and terms["subgoal/clarified"] == 0.2
    assert terms["subgoal/relevant_rows"] == 0.1
    assert terms["process/well_formed"] == 0.02 and terms["process/valid_call"] == 0.05
    assert terms["penalty/unparseable"] == -0.2 and terms["penalty/invalid_call"] == -0.1
    assert terms["penalty/repeat"] == -0.5 and terms["penalty/turn_cost"] == -0.01
    assert terms["penalty/sandbox"] == -0.3
    assert all(name.count("/") == 1 for name in terms)


def test_base_weights_hold_only_the_generic_terms() -> None:
    assert list(RewardWeights().terms()) == GENERIC


@pytest.mark.parametrize(("env_id", "own"), [
    ("polyturn/SQLAnalyst-v0",
     ["subgoal/schema_inspected", "subgoal/clarified", "subgoal/relevant_rows", "penalty/sandbox"]),
    ("polyturn/CustomerService-v0",
     ["penalty/sandbox", "subgoal/verified", "subgoal/details", "subgoal/order_checked"]),
    ("polyturn/Negotiation-v0", ["outcome/utility", "outcome/fairness"]),
    ("polyturn/TwentyQuestions-v0", ["penalty/unknown_question"]),
    ("meeting", ["subgoal/clarified"]),
])
def test_each_env_reports_the_generic_terms_and_its_own_only(env_id: str, own: list[str], meeting_env: str) -> None:
    env = make_env(meeting_env if env_id == "meeting" else env_id)
    try:
        env.reset(seed=0)
        assert set(env.step("no action here")[4]["reward_terms"]) == set(GENERIC) | set(own)
    finally:
        env.close()


def test_terms_keep_the_order_they_were_summed_in() -> None:
    # A float sum depends on its order: these orders are the ones rewards were summed in before each env
    # declared its own terms, so every step's reward is the same float as then.
    assert list(SQLAnalystWeights().terms()) == GENERIC[:3] + [
        "subgoal/schema_inspected", "subgoal/clarified", "subgoal/relevant_rows"] + GENERIC[3:] + ["penalty/sandbox"]
    assert list(CustomerServiceWeights().terms()) == GENERIC + [
        "penalty/sandbox", "subgoal/verified", "subgoal/details", "subgoal/order_checked"]
    details = reward_terms(StepEvents(parsed=True, subgoals=frozenset({"details"})), CustomerServiceWeights())
    assert sum(details.values()) == 0.21000000000000002  # 0.02 - 0.01 + 0.2; summed sub-goal first it is 0.21


class _Undeclared(ToolEnv):
    """A tool env whose tools use terms its weights do not declare."""

    def __init__(self) -> None:
        super().__init__()
        self.tools |= {"find": self._find, "forbidden": self._forbidden}

    def _new_task(self, seed: int, options) -> EpisodeStart:
        return EpisodeStart(task_id="t", question="Find it.", level=1, ambiguous=False, privileged="",
                            key_actions=("find",))

    def _find(self, args) -> ToolResult:
        self.achieve("found")
        return ToolResult("Found.")

    def _forbidden(self, args) -> ToolResult:
        return ToolResult("Refused.", error="refused", sandbox_violation=True)


def test_an_undeclared_subgoal_or_sandbox_penalty_is_an_error() -> None:
    env = _Undeclared()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="declare subgoal_found"):
        env.step(format_action("find", {}))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="declare penalty_sandbox"):
        env.step(format_action("forbidden", {}))


def test_weights_of_another_class_are_read_field_by_field(sales_db) -> None:
    env = SQLAnalystEnv(db_path=sales_db, reward_weights=RewardWeights(penalty_turn_cost=-1.0))
    assert env.weights == SQLAnalystWeights(penalty_turn_cost=-1.0)
    env.close()
    with pytest.raises(ValidationError, match="subgoal_verified"):
        SQLAnalystEnv(db_path=sales_db, reward_weights=CustomerServiceWeights())


def test_weights_accept_term_names_and_validate() -> None:
    assert RewardWeights.model_validate({"outcome/success": 3.0}).outcome_success == 3.0
    assert RewardWeights(penalty_repeat=-1.0).terms()["penalty/repeat"] == -1.0
    with pytest.raises(ValidationError, match="penalty_repeat"):
        RewardWeights(penalty_repeat=0.5)  # a penalty must not become a bonus
    with pytest.raises(ValidationError, match="outcome_succes"):
        RewardWeights.model_validate({"outcome/succes": 1.0})


def test_reward_terms_doctest() -> None:
    assert doctest.testmod(rewards_module).failed == 0


def test_repeat_pays_no_positive_term() -> None:
    ev = StepEvents(parsed=True, valid_call=True, repeat=True, subgoals=frozenset({"clarified"}))
    terms = reward_terms(ev, SQLAnalystWeights())
    assert set(terms) == ALL_TERMS
    assert all(v <= 0 for v in terms.values())
    assert terms["penalty/repeat"] == -0.5


# ----- through the env: every term positive once, and not paid again on a repeat -----------

def _step(env: SQLAnalystEnv, action: str):
    obs, reward, terminated, truncated, info = env.step(action)
    terms = info["reward_terms"]
    assert set(terms) == ALL_TERMS
    assert math.isclose(sum(terms.values()), reward, abs_tol=1e-12)
    return obs, reward, terminated, truncated, info


def _reset_to(env: SQLAnalystEnv, *, ambiguous: bool, level: int = 2) -> None:
    """Reset ``env`` to the first level-``level`` task that is (or is not) ambiguous."""
    for seed in range(200):
        env.reset(seed=seed, options={"level": level})
        if env.task.ambiguous == ambiguous:
            return
    raise AssertionError("no such task")


def test_process_terms_and_turn_cost(env: SQLAnalystEnv) -> None:
    env.reset(seed=1)
    action = format_action("list_tables", {})
    terms = _step(env, action)[4]["reward_terms"]
    assert terms["process/well_formed"] == 0.02 and terms["process/valid_call"] == 0.05
    assert terms["penalty/turn_cost"] == -0.01 and terms["penalty/repeat"] == 0.0
    again = _step(env, action)[4]
    assert again["error"] == "repeat"
    assert again["reward_terms"]["penalty/repeat"] == -0.5
    assert all(again["reward_terms"][t] == 0.0 for t in POSITIVE)


def test_repeat_ignores_thought_but_not_args(env: SQLAnalystEnv) -> None:
    env.reset(seed=1)
    _step(env, format_action("describe_table", {"table": "sales"}, "one"))
    assert _step(env, format_action("describe_table", {"table": "sales"}, "two"))[4]["error"] == "repeat"
    assert _step(env, format_action("describe_table", {"table": "orders"}))[4]["error"] is None


def test_schema_inspected_once(env: SQLAnalystEnv) -> None:
    env.reset(seed=1)
    assert _step(env, format_action("list_tables", {}))[4]["reward_terms"]["subgoal/schema_inspected"] == 0.0
    first = _step(env, format_action("describe_table", {"table": "sales"}))[4]
    assert first["reward_terms"]["subgoal/schema_inspected"] == 0.2
    other = _step(env, format_action("describe_table", {"table": "products"}))[4]
    assert other["reward_terms"]["subgoal/schema_inspected"] == 0.0  # once per episode
    repeat = _step(env, format_action("describe_table", {"table": "sales"}))[4]
    assert repeat["reward_terms"]["subgoal/schema_inspected"] == 0.0


def test_clarified_only_on_ambiguous_tasks_and_once(env: SQLAnalystEnv) -> None:
    _reset_to(env, ambiguous=True)
    ask = format_action("ask_user", {"question": "What do you mean?"})
    terms = _step(env, ask)[4]["reward_terms"]
    assert terms["subgoal/clarified"] == 0.2 and terms["process/valid_call"] == 0.05
    again = _step(env, ask)[4]["reward_terms"]
    assert again["subgoal/clarified"] == 0.0 and again["penalty/repeat"] == -0.5
    other = _step(env, format_action("ask_user", {"question": "Sorry, again?"}))[4]["reward_terms"]
    assert other["subgoal/clarified"] == 0.0

    _reset_to(env, ambiguous=False)
    obs, _, _, _, info = _step(env, ask)
    assert obs == "My question is complete as stated."
    assert info["reward_terms"]["subgoal/clarified"] == 0.0
    assert info["reward_terms"]["process/valid_call"] == 0.0  # a needless question earns nothing


def test_relevant_rows_needs_rows_from_gold_tables(env: SQLAnalystEnv) -> None:
    env.reset(seed=3, options={"level": 1})
    assert _step(env, format_action("run_sql", {"sql": "SELECT * FROM products LIMIT 2"}))[4]["reward_terms"][
        "subgoal/relevant_rows"
    ] == 0.0
    empty = "SELECT * FROM sales WHERE zone = 'Atlantis'"
    assert _step(env, format_action("run_sql", {"sql": empty}))[4]["reward_terms"]["subgoal/relevant_rows"] == 0.0
    gold = format_action("run_sql", {"sql": env.task.gold_sql})
    assert _step(env, gold)[4]["reward_terms"]["subgoal/relevant_rows"] == 0.1
    assert _step(env, gold)[4]["reward_terms"]["subgoal/relevant_rows"] == 0.0
    other = format_action("run_sql", {"sql": "SELECT zone, SUM(units) FROM sales GROUP BY zone"})
    assert _step(env, other)[4]["reward_terms"]["subgoal/relevant_rows"] == 0.0


def test_penalties(env: SQLAnalystEnv) -> None:
    env.reset(seed=1)
    bad = _step(env, "I am not sure what to do")[4]
    assert bad["reward_terms"]["penalty/unparseable"] == -0.2 and bad["error"] == "format"
    assert bad["reward_terms"]["process/well_formed"] == 0.0
    unknown = _step(env, format_action("drop_everything", {}))[4]
    assert unknown["reward_terms"]["penalty/invalid_call"] == -0.1 and unknown["error"] == "unknown_tool"
    assert unknown["reward_terms"]["process/well_formed"] == 0.02
    bad_args = _step(env, format_action("run_sql", {"query": "SELECT 1"}))[4]
    assert bad_args["reward_terms"]["penalty/invalid_call"] == -0.1 and bad_args["error"] == "bad_args"
    denied = _step(env, format_action("run_sql", {"sql": "DROP TABLE orders"}))[4]
    assert denied["reward_terms"]["penalty/sandbox"] == -0.3 and denied["error"] == "sandbox_denied"
    assert denied["reward_terms"]["process/valid_call"] == 0.0
    broken = _step(env, format_action("run_sql", {"sql": "SELECT nope FROM sales"}))[4]
    assert broken["error"] == "sql_error" and broken["reward_terms"]["penalty/sandbox"] == 0.0
    assert broken["reward_terms"]["process/valid_call"] == 0.0


def test_outcomes(env: SQLAnalystEnv) -> None:
    env.reset(seed=5)
    win = _step(env, format_action("submit_answer", {"answer": env.task.gold.value}))
    assert win[2] is True and win[3] is False and win[4]["success"] is True
    assert win[4]["reward_terms"]["outcome/success"] == 10.0

    env.reset(seed=5)
    lose = _step(env, format_action("submit_answer", {"answer": "no idea"}))
    assert lose[2] is True and lose[4]["success"] is False
    assert lose[4]["reward_terms"]["outcome/failure"] == -5.0 and lose[4]["reward_terms"]["outcome/success"] == 0.0

    env.reset(seed=5, options={"max_turns": 2})
    _step(env, format_action("list_tables", {}))
    out = _step(env, format_action("remember", {"note": "zone is East China"}))
    assert out[2] is False and out[3] is True  # truncated, never terminated
    assert out[4]["reward_terms"]["outcome/timeout"] == -5.0 and out[4]["success"] is False


def test_custom_weights_flow_into_rewards(sales_db) -> None:
    env = SQLAnalystEnv(db_path=sales_db, reward_weights={"penalty/turn_cost": -1.0, "process/valid_call": 0.0})
    env.reset(seed=1)
    terms = env.step(format_action("list_tables", {}))[4]["reward_terms"]
    assert terms["penalty/turn_cost"] == -1.0 and terms["process/valid_call"] == 0.0
    env.close()
