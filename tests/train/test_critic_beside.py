"""The separate critic's update beside the next iteration's sampling (``run.critic_beside``): the run resumes
exactly, its log has every iteration once and in order, and an error in the update stops the run."""

from __future__ import annotations

import json
import threading

import pytest

from polyturn.train.critics import SeparateLearner
from polyturn.train.trainer import Trainer
from tests.train.conftest import assert_same_weights, stopped_copy

# Two cores' worth of threads: sampling and the critic's update each get rollout_threads = 1.
BESIDE = ("run.train_threads=2", "run.rollout_threads=1", "run.checkpoint_every=2", "curriculum.warmup_iters=1",
          "curriculum.mixed_iters=1", "curriculum.ppo_iters=2", "env.eval_episodes=1",
          "rollout.eval_sampled_temperature=null", "env.kwargs={max_turns: 4}")


def _rl_rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") in ("warmup", "mixed", "ppo")]


def _critic_threads(monkeypatch) -> list[str]:
    """The names of the threads SeparateLearner.update runs in, in call order."""
    names: list[str] = []
    update = SeparateLearner.update

    def recorded(self, *args, **kwargs):
        names.append(threading.current_thread().name)
        return update(self, *args, **kwargs)

    monkeypatch.setattr(SeparateLearner, "update", recorded)
    return names


@pytest.mark.slow
def test_the_critic_update_beside_sampling_resumes_exactly_and_logs_every_iteration(tmp_path, make_cfg, monkeypatch):
    names = _critic_threads(monkeypatch)
    straight = tmp_path / "straight"
    Trainer(make_cfg(straight, *BESIDE)).run()
    assert len(names) == 4 and all(n.startswith("polyturn-critic") for n in names), names
    assert not any(t.name.startswith("polyturn-critic") for t in threading.enumerate())  # the pool is shut down
    rows = _rl_rows(straight)
    assert [r["iter"] for r in rows] == [0, 1, 2, 3]  # once each, in order, with the update's own metrics
    assert all("losses/value_loss" in r and r["perf/update_critic_s"] > 0 and r["perf/critic_wait_s"] >= 0
               for r in rows)

    resumed = tmp_path / "resumed"
    stopped_copy(straight, resumed, at="ckpt-iter0002", later=("ckpt-iter0004", "ckpt-final"))
    tr = Trainer(make_cfg(resumed, *BESIDE), resume=True)
    assert tr.state.iter == 2
    tr.run()
    assert_same_weights(straight / "ckpt-iter0004", resumed / "ckpt-iter0004")
    assert [r["iter"] for r in _rl_rows(resumed)] == [0, 1, 2, 3]


def test_the_critic_update_runs_in_line_where_it_cannot_run_beside(tmp_path, make_cfg, monkeypatch):
    names = _critic_threads(monkeypatch)
    # One thread for training (configs/test_tiny.yaml): no second core for the critic.
    Trainer(make_cfg(tmp_path / "one", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0",
                     "env.eval_episodes=1")).run()
    Trainer(make_cfg(tmp_path / "off", *BESIDE, "run.critic_beside=false", "curriculum.mixed_iters=0",
                     "curriculum.ppo_iters=0")).run()
    assert names == ["MainThread", "MainThread"]
    assert all("perf/critic_wait_s" not in r for d in ("one", "off") for r in _rl_rows(tmp_path / d))


def test_an_error_in_the_critic_update_beside_sampling_stops_the_run(tmp_path, make_cfg, monkeypatch):
    calls: list[str] = []
    update = SeparateLearner.update

    def fails_second(self, *args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise RuntimeError("the critic's update failed")
        return update(self, *args, **kwargs)

    monkeypatch.setattr(SeparateLearner, "update", fails_second)
    with pytest.raises(RuntimeError, match="the critic's update failed"):
        Trainer(make_cfg(tmp_path / "run", *BESIDE)).run()
    assert len(calls) == 2 and calls[1].startswith("polyturn-critic")
    assert not any(t.name.startswith("polyturn-critic") for t in threading.enumerate())
    # Iteration 0 was logged when the update that failed had not yet started; iteration 1 never completed.
    assert [r["iter"] for r in _rl_rows(tmp_path / "run")] == [0]
