"""The scripted expert: near-perfect on seeded tasks, honest about intent, and noisy on demand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from polyturn.envs.actions import ToolCall, parse_action
from polyturn.envs.sql.env import SQLAnalystEnv
from polyturn.envs.sql.expert import NoiseConfig, SQLExpert, parse_table


def play(env: SQLAnalystEnv, expert: SQLExpert, seed: int, options: dict | None = None) -> tuple[list[str], list[dict]]:
    obs, info = env.reset(seed=seed, options=options)
    expert.reset(obs, info)
    actions, infos = [], []
    while True:
        actions.append(expert.act(obs, info))
        obs, _, terminated, truncated, info = env.step(actions[-1])
        infos.append(info)
        if terminated or truncated:
            return actions, infos


def success_rate(env: SQLAnalystEnv, expert: SQLExpert, seeds: range) -> float:
    return sum(play(env, expert, s)[1][-1]["success"] for s in seeds) / len(seeds)


def test_expert_solves_500_seeded_tasks(env: SQLAnalystEnv) -> None:
    expert = SQLExpert(env, seed=0)
    wins, asked_when_needed, levels = 0, 0, set()
    for seed in range(500):
        actions, infos = play(env, expert, seed)
        wins += infos[-1]["success"]
        levels.add(env.task.level)
        tools = [parse_action(a).tool for a in actions]
        assert ("ask_user" in tools) == env.task.ambiguous, (seed, actions)
        asked_when_needed += env.task.ambiguous
        assert not any(i["error"] for i in infos), (seed, actions, infos)
    assert wins / 500 >= 0.98
    assert levels == {1, 2, 3, 4, 5} and asked_when_needed > 50


def test_noisy_expert_is_clearly_worse(env: SQLAnalystEnv) -> None:
    seeds = range(1000, 1150)
    exact = success_rate(env, SQLExpert(env, seed=1), seeds)
    noisy3 = success_rate(env, SQLExpert(env, noise=0.3, seed=1, plot=False), seeds)
    noisy5 = success_rate(env, SQLExpert(env, noise=0.5, seed=1, plot=False), seeds)
    assert exact >= 0.98
    assert noisy3 <= exact - 0.25 and noisy5 <= noisy3 - 0.05 and noisy5 >= 0.1


def test_expert_reads_the_reply_instead_of_peeking(env: SQLAnalystEnv) -> None:
    for seed in range(200):
        obs, info = env.reset(seed=seed, options={"level": 2})
        if env.task.ambiguous and env.task.ambiguity.slot == "measure":
            break
    task = env.task
    misleading = "I mean by revenue." if "units" in task.reply else "I mean by units sold."
    env.task = dataclasses.replace(task, reply=misleading)  # the user now says the other thing
    expert = SQLExpert(env)
    expert.reset(obs, info)
    while True:
        action = expert.act(obs, info)
        obs, _, terminated, truncated, info = env.step(action)
        call = parse_action(action)
        if call.tool == "run_sql":
            wanted = "SUM(revenue)" if "revenue" in misleading else "SUM(units)"
            assert wanted in call.args["sql"]
        if terminated or truncated:
            break
    assert not info["success"]  # it followed the (misleading) reply, not the hidden gold


def test_thoughts_are_short_and_actions_canonical(env: SQLAnalystEnv) -> None:
    expert = SQLExpert(env, noise=0.3, seed=5)
    for seed in range(40):
        actions, _ = play(env, expert, seed)
        for action in actions:
            call = parse_action(action)
            if isinstance(call, ToolCall):
                assert call.thought and len(call.thought.split()) <= 10, action


def test_same_seed_same_episode(env: SQLAnalystEnv) -> None:
    a = [play(env, SQLExpert(env, noise=0.5, seed=9), s)[0] for s in range(10)]
    b = [play(env, SQLExpert(env, noise=0.5, seed=9), s)[0] for s in range(10)]
    c = [play(env, SQLExpert(env, noise=0.5, seed=10), s)[0] for s in range(10)]
    assert a == b and a != c


def _tools(actions: list[str]) -> list[str]:
    return [c.tool if isinstance(c := parse_action(a), ToolCall) else "invalid" for a in actions]


def test_each_mistake_kind(env: SQLAnalystEnv) -> None:
    seeds = range(60)

    def run(**rates: float) -> list[tuple[list[str], list[dict], bool]]:
        expert = SQLExpert(env, noise=NoiseConfig(**rates), seed=2, plot=False)
        out = []
        for s in seeds:
            actions, infos = play(env, expert, s)
            out.append((actions, infos, env.task.ambiguous))
        return out

    for actions, infos, _ in run(skip_inspect=1.0):
        assert "list_tables" not in _tools(actions) and infos[-1]["success"]
    for actions, infos, _ in run(format_error=1.0):
        assert [i["error"] for i in infos].count("format") == 1 and infos[-1]["success"]
    for actions, infos, _ in run(sql_typo=1.0):
        errors = [i["error"] for i in infos]
        assert errors.count("sql_error") == 1 and infos[-1]["success"], (actions, errors)
    guessed = run(skip_clarification=1.0)
    ambiguous = [infos[-1]["success"] for actions, infos, amb in guessed if amb]
    assert all("ask_user" not in _tools(actions) for actions, _, _ in guessed)
    assert ambiguous and 0.2 <= sum(ambiguous) / len(ambiguous) <= 0.8  # a coin flip, not a certainty
    assert sum(infos[-1]["success"] for _, infos, _ in run(wrong_measure=1.0)) / len(seeds) < 0.5
    assert sum(infos[-1]["success"] for _, infos, _ in run(wrong_period=1.0)) / len(seeds) < 0.3


def test_noise_config() -> None:
    assert NoiseConfig().label() == "expert"
    assert NoiseConfig.uniform(0.3).label() == "noisy(0.3)"
    assert NoiseConfig(sql_typo=0.2).label() == "noisy(custom)"
    with pytest.raises(ValidationError):
        NoiseConfig(sql_typo=1.5)
    with pytest.raises(ValidationError):
        NoiseConfig(typo=0.1)


def test_parse_table() -> None:
    cols, rows = parse_table("product | total\nFan | 120\nLamp | 2.5\nNULL | -3\n(3 rows)")
    assert cols == ["product", "total"]
    assert rows == [["Fan", 120], ["Lamp", 2.5], [None, -3]]
    assert parse_table("(no rows)") == ([], [])


def test_act_before_reset_raises(sales_db: Path) -> None:
    env = SQLAnalystEnv(db_path=sales_db)
    with pytest.raises(RuntimeError, match="Expected reset"):
        SQLExpert(env).act("", {})
    env.close()


def test_both_answer_styles_solve_tasks(env: SQLAnalystEnv) -> None:
    seeds = range(2000, 2100)
    copy = SQLExpert(env, seed=3, answer_style="copy")
    assert success_rate(env, copy, seeds) >= 0.98
    actions, _ = play(env, SQLExpert(env, seed=3), 2000)
    assert parse_action(actions[-1]).args == {"from_last_result": True}
    actions, _ = play(env, copy, 2000)
    assert "answer" in parse_action(actions[-1]).args
    with pytest.raises(ValueError, match="answer_style"):
        SQLExpert(env, answer_style="guess")
