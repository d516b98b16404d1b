"""The one checkpoint-through-collector path: a loaded checkpoint and a live collector give the same episodes."""

from __future__ import annotations

import pytest

from polyturn.acting.checkpoint import held_out_tasks, load_checkpoint, run_actor
from polyturn.acting.policies import resolve_policy
from polyturn.acting.registry import make_env


def _signature(eps) -> list[tuple]:
    return [(ep.seed, ep.task_id, [t.action_ids for t in ep.turns], ep.success, ep.policy) for ep in eps]


def test_loaded_checkpoint_and_live_collector_play_the_same_episodes(ckpt_run):
    ckpt = load_checkpoint(ckpt_run)  # a run directory: its latest checkpoint (ckpt-b)
    assert ckpt.label == "ckpt-b" and not ckpt.actor.model.training
    cfg = ckpt.config
    tasks = held_out_tasks(cfg, 5)
    assert [t["seed"] for t in tasks] == list(range(1000, 1005))  # env.eval_seed_start of the fixture's config
    ticks: list[int] = []
    fresh = run_actor(ckpt, tasks, temperature=1.0, seed=3, num_envs=2, progress=ticks.append)
    assert sum(ticks) == 5 and [ep.seed for ep in fresh] == list(range(1000, 1005))
    assert all(len(ep.turns) <= 3 for ep in fresh)  # the config's env.kwargs (max_turns 3) were applied

    envs = [make_env(cfg.env.id, cfg.env.kwargs).unwrapped for _ in range(2)]
    try:
        live = run_actor(ckpt.collector(envs, env_id=cfg.env.id), tasks, temperature=1.0, seed=3, label="ckpt-b")
    finally:
        for e in envs:
            e.close()
    assert _signature(live) == _signature(fresh)
    other_seed = run_actor(ckpt, tasks, temperature=1.0, seed=4, num_envs=2)
    assert _signature(other_seed) != _signature(fresh)  # the seed drives sampling


def test_env_arguments_override_the_config(ckpt_run):
    ckpt = load_checkpoint(resolve_policy(str(ckpt_run / "ckpt-a")))
    eps = run_actor(ckpt, [{"seed": 7}], temperature=0.0, seed=0, env_kwargs={"max_turns": 1}, label="x")
    assert len(eps[0].turns) == 1 and eps[0].policy == "x"
    with pytest.raises(ValueError, match="registered env id"):
        run_actor(ckpt, [{"seed": 7}], temperature=0.0, seed=0, env_id="polyturn/Nope-v0")


def test_bad_arguments_are_clear_errors(ckpt_run, tmp_path):
    with pytest.raises(ValueError, match="built-in policy 'expert'"):
        load_checkpoint("expert")
    (tmp_path / "ckpt-x" / "actor").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="Expected a saved actor"):
        load_checkpoint(tmp_path / "ckpt-x")
    ckpt = load_checkpoint(ckpt_run / "ckpt-a")
    with pytest.raises(ValueError, match="temperature >= 0"):
        run_actor(ckpt, [{"seed": 0}], temperature=-1.0, seed=0)
    with pytest.raises(ValueError, match="num_envs >= 1"):
        run_actor(ckpt, [{"seed": 0}], temperature=0.0, seed=0, num_envs=0)
