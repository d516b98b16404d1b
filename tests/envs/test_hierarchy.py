"""Hierarchical agents' env side: the manager/worker env (switching on done, after k turns, at the turn limit),
the worker's intrinsic reward and the manager's extrinsic one, the env specs' subgoal menus, and hierarchical
demonstrations (the expert cut into the subgoals it reaches)."""

from __future__ import annotations

import random

import pytest

from polyturn.acting.hierarchy import expert_plan, hierarchical_demos, play_game
from polyturn.acting.registry import env_spec, make_env
from polyturn.envs.actions import format_action
from polyturn.envs.hierarchy import (
    DONE_TOOL,
    INTRINSIC,
    MANAGER,
    SET_TOOL,
    UNREACHED,
    WORKER,
    HierarchicalEnv,
    PlanManager,
    subgoal_durations,
    subgoal_reached,
)
from polyturn.envs.multi_agent import check_multi_agent_env
from polyturn.envs.spec import Subgoal

CS, SQL = "polyturn/CustomerService-v0", "polyturn/SQLAnalyst-v0"


def _env(env_id: str = SQL, **kw) -> HierarchicalEnv:
    return HierarchicalEnv(make_env(env_id), subgoals=env_spec(env_id).subgoals, **kw)


def _set(name: str) -> str:
    return format_action(SET_TOOL, {"name": name})


@pytest.mark.parametrize("env_id", [CS, SQL])
def test_the_hierarchical_env_keeps_the_multi_role_contract(env_id):
    check_multi_agent_env(_env(env_id, k=2))


def test_the_worker_reads_its_subgoal_and_reaching_it_pays_the_intrinsic_reward_once():
    env = _env(SQL, k=10, intrinsic=0.5)
    env.reset(seed=3)
    assert env.agent_selection == MANAGER
    ms = env.step(_set("inspect"))
    assert ms.updates[WORKER].observation == "Subgoal: Inspect the schema of the tables the question needs."
    assert ms.updates[MANAGER].info["subgoal_index"] == 0 and env.agent_selection == WORKER
    ms = env.step(format_action("list_tables"))  # no table described yet: not reached
    assert INTRINSIC not in ms.updates[WORKER].reward_terms and env.agent_selection == WORKER
    ms = env.step(format_action("describe_table", {"table": "sales"}))
    w, m = ms.updates[WORKER], ms.updates[MANAGER]
    assert w.reward_terms[INTRINSIC] == 0.5 and w.info["subgoals"] == ["schema_inspected"]
    # The manager is paid the env's reward of the worker's step, never the intrinsic one.
    assert m.reward == pytest.approx(w.reward - 0.5) and INTRINSIC not in m.reward_terms
    assert w.info["subgoal_index"] == 0
    ms = env.step(format_action("describe_table", {"table": "orders"}))
    assert INTRINSIC not in ms.updates[WORKER].reward_terms  # paid once


def test_a_checked_subgoal_left_unreached_costs_the_worker_on_its_last_turn_on_it():
    env = _env(SQL, k=2, unreached=0.25)
    env.reset(seed=3)
    env.step(_set("query"))
    ms = env.step(format_action(DONE_TOOL))  # declared done, not reached
    assert ms.updates[WORKER].reward == -0.25 and ms.updates[WORKER].reward_terms == {UNREACHED: -0.25}
    assert ms.updates[WORKER].info["reward_terms"] == {UNREACHED: -0.25} and ms.updates[MANAGER].reward == 0.0
    env.step(_set("inspect"))
    ms = env.step(format_action("list_tables"))  # one turn of two: nothing charged yet
    assert UNREACHED not in ms.updates[WORKER].reward_terms
    ms = env.step(format_action("remember", {"note": "x"}))  # k turns spent, not reached
    assert ms.updates[WORKER].reward_terms[UNREACHED] == -0.25 and env.agent_selection == MANAGER
    env.step(_set("inspect"))
    env.step(format_action("describe_table", {"table": "sales"}))  # reached: paid, and nothing charged after
    ms = env.step(format_action(DONE_TOOL))
    assert ms.updates[WORKER].reward == 0.0 and UNREACHED not in ms.updates[WORKER].reward_terms
    env.step(_set("inspect"))  # set again once reached: its check need not hold twice, nothing charged
    assert UNREACHED not in env.step(format_action(DONE_TOOL)).updates[WORKER].reward_terms
    # The game's end charges the subgoal in force; the default charges nothing.
    env = HierarchicalEnv(make_env(SQL, {"max_turns": 1}), subgoals=env_spec(SQL).subgoals, k=5, unreached=0.5)
    env.reset(seed=3)
    env.step(_set("query"))
    ms = env.step(format_action("list_tables"))
    assert ms.truncated and ms.updates[WORKER].reward_terms[UNREACHED] == -0.5
    env = _env(SQL, k=1)
    env.reset(seed=3)
    env.step(_set("query"))
    assert UNREACHED not in env.step(format_action("list_tables")).updates[WORKER].reward_terms
    with pytest.raises(ValueError, match="unreached >= 0"):
        _env(SQL, unreached=-1.0)


def test_subgoal_done_hands_the_turn_to_the_manager_without_stepping_the_env():
    env = _env(SQL, k=10)
    env.reset(seed=3)
    env.step(_set("query"))
    turn_before = env.env.turn
    ms = env.step(format_action(DONE_TOOL))
    assert env.env.turn == turn_before and env.agent_selection == MANAGER
    assert ms.updates[MANAGER].observation.startswith("Subgoal query (not reached): the worker says it is done")
    assert ms.updates[WORKER].reward == 0.0 and ms.updates[WORKER].info["action_type"] == DONE_TOOL
    env.step(_set("answer"))
    assert env.role_view(MANAGER)["history"][0]["end"] == "done"


def test_after_k_worker_turns_the_manager_is_asked_again():
    env = _env(SQL, k=2)
    env.reset(seed=3)
    env.step(_set("inspect"))
    env.step(format_action("list_tables"))
    assert env.agent_selection == WORKER
    ms = env.step(format_action("remember", {"note": "x"}))
    assert env.agent_selection == MANAGER and "2 worker turns on it" in ms.updates[MANAGER].observation


def test_the_env_turn_limit_ends_the_game_truncated_for_both_roles():
    env = HierarchicalEnv(make_env(SQL, {"max_turns": 2}), subgoals=env_spec(SQL).subgoals, k=5)
    env.reset(seed=3)
    env.step(_set("inspect"))
    env.step(format_action("list_tables"))
    ms = env.step(format_action("remember", {"note": "x"}))
    assert ms.truncated and not ms.terminated
    assert all(up.info["success"] is False for up in ms.updates.values())
    with pytest.raises(RuntimeError, match="finished game"):
        env.step(format_action("list_tables"))


def test_an_invalid_manager_action_is_answered_counts_and_the_manager_acts_again_until_out_of_turns():
    env = _env(SQL, max_subgoals=2)
    env.reset(seed=3)
    ms = env.step(_set("dance"))
    assert env.agent_selection == MANAGER and ms.updates[MANAGER].info["action_valid"] is False
    assert "expected a subgoal name among ['inspect', 'clarify', 'query', 'answer']" in ms.updates[MANAGER].observation
    ms = env.step("no action here")
    assert ms.truncated and ms.updates[MANAGER].info["error"].startswith("format")


def test_free_mode_takes_the_managers_own_text():
    env = HierarchicalEnv(make_env(SQL), mode="free")
    env.reset(seed=3)
    ms = env.step(format_action(SET_TOOL, {"text": "Look at the  sales view."}))
    assert ms.updates[WORKER].observation == "Subgoal: Look at the sales view."
    with pytest.raises(ValueError, match="mode 'free'"):
        HierarchicalEnv(make_env(SQL), subgoals=())


def test_subgoal_checks_and_their_validation():
    assert subgoal_reached(Subgoal(name="a", text="", check="subgoal:x"), {"subgoals": ["x"]})
    assert subgoal_reached(Subgoal(name="a", text="", check="tool:t"), {"action_type": "t", "error": None})
    assert not subgoal_reached(Subgoal(name="a", text="", check="tool:t"), {"action_type": "t", "error": "bad"})
    assert subgoal_reached(Subgoal(name="a", text="", check="success"), {"success": True})
    assert not subgoal_reached(Subgoal(name="a", text=""), {"success": True})
    with pytest.raises(ValueError, match="check as 'subgoal:<name>'"):
        Subgoal(name="a", text="", check="reached")
    with pytest.raises(ValueError, match="identifier"):
        Subgoal(name="a b", text="")


@pytest.mark.parametrize("env_id", [CS, SQL, "meeting/MeetingBooking-v0"])
def test_expert_demonstrations_cut_into_subgoals_replay_the_expert_and_succeed(env_id):
    records = list(hierarchical_demos(env_id, episodes=6, noise=0.0, seed=0, k=4))
    assert [r["role"] for r in records] == [MANAGER, WORKER] * 6
    menu = [g.name for g in env_spec(env_id).subgoals]
    for manager, worker in zip(records[::2], records[1::2], strict=True):
        assert manager["seed"] == worker["seed"] and worker["success"] and manager["success"]
        names = [h["name"] for h in manager["subgoals_set"]]
        assert names[-1] == menu[-1] and all(h["reached"] for h in manager["subgoals_set"])
        # The manager's valid turns and the worker's turns agree on the durations.
        infos_m = [t["info"] for t in manager["turns"]]
        durations = subgoal_durations(infos_m, [t["info"] for t in worker["turns"]])
        assert durations == [h["turns"] for h in manager["subgoals_set"]] and sum(durations) == len(worker["turns"])
        # The worker's first text is the task and its subgoal, as the collector joins them.
        first = worker["turns"][0]["observation"]
        assert first.endswith("\nSubgoal: " + env_spec(env_id).subgoals[menu.index(names[0])].text)
        done = [t for t in worker["turns"] if t["info"]["action_type"] == DONE_TOOL]
        assert len(done) == len(names) - 1  # every subgoal but the last ends with the worker's word


def test_the_plan_of_a_failed_episode_gives_the_leftover_actions_to_the_next_subgoal():
    menu = env_spec(SQL).subgoals
    steps = [("a1", {"subgoals": ["schema_inspected"]}), ("a2", {"subgoals": []}), ("a3", {"subgoals": []})]
    plan = expert_plan(None, steps, menu, {"ambiguous": False})
    assert plan == [("inspect", ["a1"]), ("query", ["a2", "a3"])]
    assert expert_plan(None, steps, menu, {"ambiguous": True})[1][0] == "clarify"


def test_the_plan_manager_skips_what_is_reached_and_what_does_not_apply():
    env = _env(SQL, k=3)
    env.reset(seed=3)
    view = env.role_view(MANAGER)
    act = PlanManager().act(view, random.Random(0))
    assert act.endswith(_set("inspect").split("\n")[-1])
    view = {**view, "reached": frozenset({"inspect"})}
    assert '"query"' in PlanManager().act(view, random.Random(0))  # clarify applies to ambiguous tasks only


def test_play_game_records_both_roles_rewards_where_the_contract_puts_them():
    env = _env(SQL, k=10, intrinsic=1.0)
    plan = iter([_set("inspect"), _set("answer")])
    acts = iter([format_action("describe_table", {"table": "sales"}), format_action(DONE_TOOL),
                 format_action("submit_answer", {"answer": "0"})])
    recs = play_game(env, {MANAGER: lambda v: next(plan), WORKER: lambda v: next(acts)}, seed=3, env_id=SQL)
    m, w = recs[MANAGER], recs[WORKER]
    assert len(m["turns"]) == 2 and len(w["turns"]) == 3 and not w["success"]
    assert w["turns"][0]["reward_terms"][INTRINSIC] == 1.0
    assert m["turns"][0]["reward"] == pytest.approx(w["turns"][0]["reward"] - 1.0)  # extrinsic only
    assert m["turns"][1]["reward"] == pytest.approx(w["turns"][2]["reward"]) and m["turns"][1]["terminated"]


def test_polyturn_demos_writes_hierarchical_demonstrations(tmp_path, capsys):
    from polyturn.acting.jsonl import read_jsonl
    from polyturn.cli import build_parser, run_command

    out = tmp_path / "h.jsonl"
    assert run_command(build_parser().parse_args(["demos", "--env", CS, "--episodes", "3", "--hierarchy", "3",
                                                  "--out", str(out)])) == 0
    records = list(read_jsonl(out))
    assert [r["role"] for r in records] == [MANAGER, WORKER] * 3
    assert "wrote 6 records (3 tasks: a manager's and a worker's each)" in capsys.readouterr().out
