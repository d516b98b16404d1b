"""Registration with gymnasium, check_env on every polyturn env, text spaces, no torch."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from polyturn.acting.registry import env_ids, load_envs
import polyturn.envs
from polyturn.envs import TextSpace
from polyturn.envs.sql.env import SQLAnalystEnv

SRC = Path(__file__).resolve().parents[2] / "src"


def polyturn_ids() -> list[str]:
    return sorted(env_id for env_id in gymnasium.registry if env_id.startswith("polyturn/"))


def test_ids_registered_on_import() -> None:
    assert "polyturn/SQLAnalyst-v0" in polyturn_ids()
    assert {e for e in env_ids() if e.startswith("polyturn/")} == set(polyturn_ids())
    load_envs(reload_plugins=True)  # idempotent: no error, no duplicate warning
    spec = gymnasium.spec("polyturn/SQLAnalyst-v0")
    assert spec.entry_point == "polyturn.envs.sql.env:SQLAnalystEnv" and spec.max_episode_steps is None


@pytest.mark.parametrize("env_id", polyturn_ids())
def test_check_env_passes(env_id: str) -> None:
    env = gymnasium.make(env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert not [str(w.message) for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns that the env is wrapped, as it should
        check_env(env)
    env.close()


@pytest.mark.parametrize("env_id", polyturn_ids())
@pytest.mark.parametrize("options", [{"task_id": "nope"}, {"level": 99}, {"max_turns": 0}, {"tools": ["nope"]}])
def test_a_reset_that_cannot_start_leaves_the_episode_as_it_was(env_id: str, options: dict) -> None:
    """A served session's failed /reset must not half-reset the episode it keeps (turn count, repeats, tools)."""
    env = gymnasium.make(env_id).unwrapped
    obs, info = env.reset(seed=3, options={"max_turns": 5})
    action = "Thought: look.\nAction: nope_tool[{}]"
    env.step(action)
    state = (env.turn, env.max_turns, env.enabled, set(env._seen), dict(env._counts), info["task_id"])
    with pytest.raises(ValueError):
        env.reset(seed=4, options=options)
    assert (env.turn, env.max_turns, env.enabled, set(env._seen), dict(env._counts)) == state[:5]
    assert env._start.task_id == state[5]
    _, _, terminated, truncated, _ = env.step(action)  # the episode goes on
    assert env.turn == state[0] + 1 and not terminated and not truncated
    env.close()


def test_make_passes_kwargs(sales_db: Path, tmp_path: Path) -> None:
    env = gymnasium.make(
        "polyturn/SQLAnalyst-v0",
        db_path=sales_db,
        max_turns=5,
        level=3,
        reward_weights={"outcome/success": 4.0},
        plot_dir=tmp_path,
    )
    base = env.unwrapped
    assert isinstance(base, SQLAnalystEnv)
    assert base.default_max_turns == 5 and base.weights.outcome_success == 4.0 and base.plot_dir == tmp_path
    _, info = env.reset(seed=1)
    assert info["level"] == 3
    env.close()


def test_bad_kwargs_say_what_was_expected(sales_db: Path) -> None:
    with pytest.raises(ValueError, match="Expected max_turns"):
        SQLAnalystEnv(db_path=sales_db, max_turns=0)
    with pytest.raises(ValueError, match="Expected ambiguous_frac"):
        SQLAnalystEnv(db_path=sales_db, ambiguous_frac=2)


def test_text_space() -> None:
    space = TextSpace(20)
    assert "华东区销售额最高的三种产品" in space
    assert "" in space and "a" * 20 in space and "a" * 21 not in space and 5 not in space
    space.seed(0)
    samples = [space.sample() for _ in range(20)]
    assert all(isinstance(s, str) and s in space for s in samples)
    assert "x" not in TextSpace(20, min_length=2)


def test_envs_never_import_torch() -> None:
    code = (
        "import sys, polyturn.envs, polyturn.envs.sql.env, polyturn.envs.sql.expert, polyturn.acting.registry, polyturn.acting.episodes; "
        "assert 'torch' not in sys.modules, 'torch was imported'; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib should load lazily'"
    )
    # a fresh interpreter, so modules that other tests imported do not count
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(SRC), "PATH": ""}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert polyturn.envs.__doc__
