"""Cost terms beside the reward: each env's ``info["cost_terms"]`` (fixed keys, 0 when not incurred), never in it."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import pytest

import polyturn  # noqa: F401  (registers the env ids)
from polyturn.acting.episodes import run_episode
from polyturn.acting.registry import make_expert
from polyturn.envs.actions import format_action
from polyturn.envs.customer_service.env import CustomerServiceEnv
from polyturn.envs.sql.env import SQLAnalystEnv

CS = ("cost/violation", "cost/error_response")


def test_customer_service_costs_a_refused_call_and_an_error_answer_and_nothing_else() -> None:
    env = CustomerServiceEnv()
    env.reset(seed=3)
    assert env.cost_names == CS
    _, reward, *_, info = env.step(format_action("get_order", {"order_id": "O99999"}))  # not verified: refused
    assert info["cost_terms"] == {"cost/violation": 1.0, "cost/error_response": 1.0}
    assert reward == pytest.approx(sum(info["reward_terms"].values()))  # the reward holds no cost
    info = env.step("Action: nonsense")[4]
    assert info["cost_terms"] == {"cost/violation": 0.0, "cost/error_response": 1.0}
    info = env.step(format_action("reply", {"text": "Could you tell me your email and zip code?"}))[4]
    assert info["cost_terms"] == {"cost/violation": 0.0, "cost/error_response": 0.0}
    env.reset(seed=3)  # a new episode starts with nothing charged
    info = env.step(format_action("reply", {"text": "Could you tell me your email and zip code?"}))[4]
    assert info["cost_terms"] == {"cost/violation": 0.0, "cost/error_response": 0.0}
    env.close()


def test_customer_service_costs_sum_to_the_episode_counters_over_noisy_expert_episodes() -> None:
    env = gymnasium.make("polyturn/CustomerService-v0").unwrapped
    policy = make_expert(env, noise=0.5, seed=1)
    charged = {name: 0.0 for name in CS}
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        policy.reset(obs, info)
        totals = {name: 0.0 for name in CS}
        while True:
            obs, _, terminated, truncated, info = env.step(policy.act(obs, info))
            assert tuple(info["cost_terms"]) == CS  # every step reports every term
            for k, v in info["cost_terms"].items():
                totals[k] += v
            if terminated or truncated:
                break
        assert totals == {"cost/violation": info["policy_violations"], "cost/error_response": info["error_responses"]}
        for k in CS:
            charged[k] += totals[k]
    assert all(v > 0 for v in charged.values())  # the noisy expert breaks the policy and makes errors
    env.close()


def test_sql_costs_a_refused_query_only(sales_db: Path, tmp_path: Path) -> None:
    env = SQLAnalystEnv(db_path=sales_db, plot_dir=tmp_path / "plots")
    env.reset(seed=1)
    assert env.cost_names == ("cost/sandbox",)
    info = env.step(format_action("run_sql", {"sql": "DELETE FROM orders"}))[4]
    assert info["error"] == "sandbox_denied" and info["cost_terms"] == {"cost/sandbox": 1.0}
    assert info["reward_terms"]["penalty/sandbox"] == -0.3  # the reward is as it was
    info = env.step(format_action("run_sql", {"sql": "SELECT x FROM nowhere"}))[4]
    assert info["error"] == "sql_error" and info["cost_terms"] == {"cost/sandbox": 0.0}  # an error, not a violation
    info = env.step(format_action("list_tables"))[4]
    assert info["cost_terms"] == {"cost/sandbox": 0.0}
    env.close()


@pytest.mark.parametrize("env_id", ["polyturn/TwentyQuestions-v0", "meeting/MeetingBooking-v0"])
def test_other_envs_report_no_cost_terms(env_id: str) -> None:
    env = gymnasium.make(env_id).unwrapped
    assert env.cost_names == ()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(3):
        *_, terminated, truncated, info = env.step(env.sample_valid_action(rng))
        assert info["cost_terms"] == {}
        if terminated or truncated:
            break
    env.close()


def test_records_keep_cost_terms_only_when_the_env_reports_them(sales_db: Path) -> None:
    cs = gymnasium.make("polyturn/CustomerService-v0")
    record = run_episode(cs, make_expert(cs, noise=0.0, seed=0), seed=0)
    assert all(tuple(t["cost_terms"]) == CS for t in record["turns"])
    tq = gymnasium.make("polyturn/TwentyQuestions-v0")
    record = run_episode(tq, make_expert(tq, noise=0.0, seed=0), seed=0)
    assert all("cost_terms" not in t for t in record["turns"])
