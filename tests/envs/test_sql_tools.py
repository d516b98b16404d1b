"""Each tool of the analyst env, the info contract, features, options, and the turn limit."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest

from polyturn.envs.actions import format_action
from polyturn.envs.sql.env import SQLAnalystEnv

RESET_KEYS = {"task_id", "question", "level", "ambiguous", "privileged", "turn", "features", "tools", "key_actions"}
STEP_KEYS = {"reward_terms", "privileged", "success", "turn", "action_valid", "action_type", "error", "wasted",
             "features"}


def act(env: SQLAnalystEnv, tool: str, args: dict | None = None):
    return env.step(format_action(tool, args or {}))


def test_reset_info_contract(env: SQLAnalystEnv) -> None:
    obs, info = env.reset(seed=4)
    assert set(info) == RESET_KEYS
    assert obs == info["question"] and obs.startswith("Today is ")
    assert info["turn"] == 0 and isinstance(info["level"], int) and isinstance(info["ambiguous"], bool)
    assert "Gold SQL:" in info["privileged"] and "Gold SQL" not in obs
    assert info["tools"] == [
        "list_tables", "describe_table", "run_sql", "ask_user", "plot", "submit_answer", "remember"
    ]
    assert all(isinstance(v, float) for v in info["features"].values())


def test_step_info_contract_and_fixed_feature_keys(env: SQLAnalystEnv) -> None:
    _, info0 = env.reset(seed=4)
    keys = set(info0["features"])
    wanted = {"turn_frac", "turns_left", "schema_inspected", "asked_user", "rows_seen", "n_errors", "n_sql"}
    wanted |= {"tools_used"}
    assert wanted <= keys
    for action in ["nonsense", format_action("list_tables"), format_action("run_sql", {"sql": "SELECT 1"})]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert STEP_KEYS <= set(info) and set(info["features"]) == keys
        assert isinstance(obs, str) and obs and isinstance(reward, float)
    assert info["turn"] == 3 and info["features"]["turn_frac"] == 3 / 8 and info["features"]["turns_left"] == 5.0
    assert info["features"]["n_sql"] == 1.0 and info["features"]["rows_seen"] == 1.0
    assert info["features"]["n_errors"] == 1.0 and info["features"]["tools_used"] == 2.0


def test_list_and_describe(env: SQLAnalystEnv) -> None:
    env.reset(seed=1)
    obs, *_, info = act(env, "list_tables")
    assert obs == "Tables: orders, prices, products, regions\nViews: sales"
    assert info["action_type"] == "list_tables" and info["action_valid"] and info["error"] is None
    obs, *_, info = act(env, "describe_table", {"table": "SALES"})
    assert obs.startswith("sales (view): order_date TEXT, year INTEGER, quarter TEXT")
    assert "revenue INTEGER" in obs and "Example: " in obs and "East China" in obs
    assert info["features"]["schema_inspected"] == 1.0
    obs, *_, info = act(env, "describe_table", {"table": "salez"})
    assert info["error"] == "bad_args" and not info["action_valid"] and "sales" in obs
    _, *_, info = act(env, "list_tables", {"extra": 1})
    assert info["error"] == "bad_args"


def test_run_sql_results_and_errors(env: SQLAnalystEnv) -> None:
    env.reset(seed=1)
    sql = "SELECT zone, zone_zh FROM regions GROUP BY zone ORDER BY zone LIMIT 2"
    obs, *_, info = act(env, "run_sql", {"sql": sql})
    assert obs == "zone | zone_zh\nCentral China | 华中\nEast China | 华东\n(2 rows)"
    obs, *_, info = act(env, "run_sql", {"sql": "SELECT * FROM orders"})
    assert len(obs.splitlines()) == 22 and "20+ rows" in obs  # header + 20 rows + note
    obs, *_, info = act(env, "run_sql", {"sql": "SELECT AVG(price) * 1.0 / 7 AS x FROM prices"})
    assert re.fullmatch(r"\d+\.\d{1,2}", obs.splitlines()[1])  # at most two decimals
    obs, *_, info = act(env, "run_sql", {"sql": "SELECT x FROM nowhere"})
    assert info["error"] == "sql_error" and "no such table" in obs and info["action_valid"]
    obs, *_, info = act(env, "run_sql", {"sql": "DELETE FROM orders"})
    assert info["error"] == "sandbox_denied" and "read-only" in obs
    _, *_, info = act(env, "run_sql", {"sql": ""})
    assert info["error"] == "bad_args"
    assert info["features"]["n_sql_errors"] == 2.0 and info["features"]["n_sql"] == 5.0


def test_ask_user(env: SQLAnalystEnv) -> None:
    for seed in range(100):
        env.reset(seed=seed, options={"level": 2})
        if env.task.ambiguous:
            break
    obs, *_, info = act(env, "ask_user", {"question": "Which measure or period do you mean?"})
    assert obs == env.task.reply and obs.startswith("I mean")
    assert info["features"]["asked_user"] == 1.0 and info["features"]["clarified"] == 1.0
    _, *_, info = act(env, "ask_user", {"nope": 1})
    assert info["error"] == "bad_args"


def test_plot_tool(env: SQLAnalystEnv, tmp_path: Path) -> None:
    env.reset(seed=1, options={"max_turns": 20})
    obs, *_, info = act(env, "plot", {"kind": "bar", "title": "华东 revenue", "x": ["a", "b"], "y": [1, 2.5]})
    assert info["error"] is None and info["features"]["plotted"] == 1.0
    assert obs == f"Saved a bar chart with 2 points to {env.task.task_id}-t1.png"
    path = tmp_path / "plots" / obs.rsplit(" to ", 1)[1]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _, *_, info = act(env, "plot", {"from_last_result": True})
    assert info["error"] == "bad_args"  # no query yet
    act(env, "run_sql", {"sql": "SELECT quarter, SUM(units) FROM sales WHERE year = 2023 GROUP BY quarter"})
    obs, *_, info = act(env, "plot", {"kind": "line", "from_last_result": True})
    assert info["error"] is None and (env.plot_dir / obs.rsplit(" to ", 1)[1]).exists() and "4 points" in obs
    for bad in [
        {"kind": "pie", "x": ["a"], "y": [1]},
        {"kind": "bar", "x": ["a", "b"], "y": [1]},
        {"kind": "bar", "x": ["a"], "y": ["one"]},
        {"kind": "bar", "x": [], "y": []},
        {"kind": "bar", "x": ["a"], "y": [1], "color": "red"},
        {"kind": "bar"},
    ]:
        obs, *_, info = act(env, "plot", bad)
        assert info["error"] == "bad_args", bad
        assert obs.startswith("Bad arguments for plot: Expected")


def test_default_plot_dir_is_made_on_first_plot(sales_db: Path) -> None:
    env = SQLAnalystEnv(db_path=sales_db)
    env.reset(seed=1)
    assert env.plot_dir is None
    obs, *_ = act(env, "plot", {"x": ["a"], "y": [1]})
    assert env.plot_dir is not None and (env.plot_dir / obs.rsplit(" to ", 1)[1]).exists()
    env.close()


def test_close_removes_the_plot_folder_the_env_made_and_keeps_a_given_one(sales_db: Path, tmp_path: Path) -> None:
    made, given = SQLAnalystEnv(db_path=sales_db), SQLAnalystEnv(db_path=sales_db, plot_dir=tmp_path / "given")
    for env in (made, given):
        env.reset(seed=1)
        act(env, "plot", {"x": ["a"], "y": [1]})
    folder = made.plot_dir
    assert folder is not None and folder.is_dir()
    made.close()
    given.close()
    assert not folder.exists() and made.plot_dir is None
    assert len(list((tmp_path / "given").glob("*.png"))) == 1  # a folder the user gave is theirs


def test_an_env_never_closed_removes_its_plot_folder_when_collected(sales_db: Path) -> None:
    env = SQLAnalystEnv(db_path=sales_db)
    env.reset(seed=1)
    act(env, "plot", {"x": ["a"], "y": [1]})
    folder = env.plot_dir
    assert folder is not None and folder.is_dir()
    env.sandbox.close()  # what close() does besides: only the folder is left to the finalizer
    del env
    gc.collect()
    assert not folder.exists()


def test_render_plots_false_checks_the_spec_and_draws_nothing(sales_db: Path, tmp_path: Path) -> None:
    drawn = SQLAnalystEnv(db_path=sales_db, plot_dir=tmp_path / "a")
    blind = SQLAnalystEnv(db_path=sales_db, plot_dir=tmp_path / "b", render_plots=False)
    for e in (drawn, blind):
        e.reset(seed=1)
    for args in ({"kind": "bar", "x": ["a", "b"], "y": [1, 2]}, {"kind": "pie", "x": ["a"], "y": [1]}):
        a, b = act(drawn, "plot", args), act(blind, "plot", args)
        assert a[0] == b[0] and a[1] == b[1] and a[-1]["reward_terms"] == b[-1]["reward_terms"]
    assert len(list((tmp_path / "a").iterdir())) == 1 and not (tmp_path / "b").exists()
    for e in (drawn, blind):
        e.close()


def test_submit_answer(env: SQLAnalystEnv) -> None:
    env.reset(seed=2)
    _, *_, info = act(env, "submit_answer", {"value": 1})
    assert info["error"] == "bad_args"
    obs, reward, terminated, truncated, info = act(env, "submit_answer", {"answer": env.task.gold.value})
    assert obs == "Answer submitted: correct." and terminated and not truncated and info["success"]
    with pytest.raises(RuntimeError, match="Expected reset"):
        act(env, "list_tables")


def test_remember_is_a_valid_noop(env: SQLAnalystEnv) -> None:
    env.reset(seed=2)
    obs, reward, *_, info = act(env, "remember", {"note": "user wants units"})
    assert obs == "Noted." and info["error"] is None and reward == pytest.approx(0.06)
    assert info["features"]["notes"] == 1.0


def test_unknown_and_disabled_tools(env: SQLAnalystEnv) -> None:
    _, info = env.reset(seed=2, options={"tools": ["run_sql", "submit_answer"]})
    assert info["tools"] == ["run_sql", "submit_answer"]
    assert "list_tables" not in env.tool_docs() and "run_sql" in env.tool_docs()
    obs, *_, info = act(env, "list_tables")
    assert info["error"] == "unknown_tool" and info["action_type"] == "invalid" and "run_sql" in obs
    with pytest.raises(ValueError, match="Expected tools among"):
        env.reset(options={"tools": ["teleport"]})
    with pytest.raises(ValueError, match="Expected reset options"):
        env.reset(options={"levle": 2})


def test_max_turns_truncates(env: SQLAnalystEnv) -> None:
    env.reset(seed=2, options={"max_turns": 3})
    results = [act(env, "run_sql", {"sql": f"SELECT {i}"}) for i in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert not any(r[2] for r in results)
    assert "Turn limit of 3" in results[-1][0]
    env.reset(seed=2)
    assert env.max_turns == 8


def test_tool_docs_mentions_format(env: SQLAnalystEnv) -> None:
    docs = env.tool_docs()
    assert "Action: tool_name[{json args}]" in docs
    for tool in ("list_tables", "describe_table", "run_sql", "ask_user", "plot", "submit_answer", "remember"):
        assert f"- {tool}[" in docs


def test_render_ansi(sales_db: Path) -> None:
    env = SQLAnalystEnv(db_path=sales_db, render_mode="ansi")
    obs, _ = env.reset(seed=2)
    assert env.render() == obs
    obs, *_ = act(env, "list_tables")
    assert env.render() == obs
    env.close()
    with pytest.raises(ValueError, match="render_mode"):
        SQLAnalystEnv(db_path=sales_db, render_mode="human")


def test_sample_valid_action_is_a_valid_enabled_call():
    import numpy as np

    from polyturn.envs.actions import ToolCall, parse_action

    import gymnasium

    env = gymnasium.make("polyturn/SQLAnalyst-v0").unwrapped
    rng = np.random.default_rng(0)
    seen = set()
    for k in range(40):
        env.reset(seed=k, options={"tools": ["list_tables", "describe_table", "run_sql", "submit_answer"]} if k % 2 else None)
        text = env.sample_valid_action(rng)
        call = parse_action(text)
        assert isinstance(call, ToolCall) and call.tool in env.explore_tools
        assert call.tool in (env.enabled or env.tools)
        _, _, terminated, _, info = env.step(text)
        assert info["action_valid"] and info["error"] is None and not terminated
        seen.add(call.tool)
    assert {"list_tables", "describe_table", "run_sql", "ask_user"} <= seen


def test_submit_from_last_result(env: SQLAnalystEnv) -> None:
    env.reset(seed=5)
    _, *_, info = act(env, "submit_answer", {"from_last_result": True})
    assert info["error"] == "bad_args"  # no query yet
    act(env, "run_sql", {"sql": env.task.gold_sql})
    obs, *_, info = act(env, "submit_answer", {"from_last_result": True})
    assert obs == "Answer submitted: correct." and info["success"]
    env.reset(seed=5)
    act(env, "run_sql", {"sql": "SELECT 'nothing' AS x"})
    obs, *_, info = act(env, "submit_answer", {"from_last_result": True})
    assert obs == "Answer submitted: incorrect." and not info["success"]


def test_the_last_result_is_the_last_query_even_when_empty_or_failed(env: SQLAnalystEnv) -> None:
    """from_last_result never reaches back past the query just run to an older result."""
    env.reset(seed=5)
    act(env, "run_sql", {"sql": env.task.gold_sql})
    act(env, "run_sql", {"sql": "SELECT zone FROM sales WHERE zone = 'Atlantis'"})  # no rows
    obs, *_, info = act(env, "plot", {"kind": "line", "from_last_result": True})
    assert info["error"] == "bad_args" and "the last query, but it returned none" in obs
    obs, _, terminated, _, info = act(env, "submit_answer", {"from_last_result": True})
    assert obs == "Answer submitted: incorrect." and terminated and not info["success"]  # its rows: none
    env.reset(seed=5)
    act(env, "run_sql", {"sql": env.task.gold_sql})
    act(env, "run_sql", {"sql": "SELECT nope FROM sales"})  # fails
    for tool, args in [("plot", {"from_last_result": True}), ("submit_answer", {"from_last_result": True})]:
        obs, _, terminated, _, info = act(env, tool, args)
        assert info["error"] == "bad_args" and not terminated
        assert obs.endswith("but the last query failed: run_sql again")
    act(env, "run_sql", {"sql": env.task.gold_sql})
    obs, *_, info = act(env, "submit_answer", {"from_last_result": True})
    assert obs == "Answer submitted: correct." and info["success"]
