"""Resume is exact: a run stopped after an iteration and resumed ends where the uninterrupted run ends."""

from __future__ import annotations

import json

import pytest

from polyturn.train.evaluation import HeldOut
from polyturn.train.logger import read_metrics
from polyturn.train.trainer import Trainer
from tests.train.conftest import assert_same_weights, stopped_copy


@pytest.mark.slow
def test_resume_with_td_targets_is_exact(tmp_path, make_cfg):
    extra = ("curriculum.warmup_iters=1", "curriculum.mixed_iters=0", "curriculum.ppo_iters=1",
             "critic.target=td", "critic.minibatch=8", "env.eval_episodes=1", "env.kwargs={max_turns: 4}")
    straight = tmp_path / "straight"
    Trainer(make_cfg(straight, *extra)).run()
    resumed = tmp_path / "resumed"
    stopped_copy(straight, resumed, at="ckpt-iter0001", later=("ckpt-iter0002", "ckpt-final"))
    tr = Trainer(make_cfg(resumed, *extra), resume=True)
    assert tr.state.iter == 1
    tr.run()
    assert_same_weights(straight / "ckpt-iter0002", resumed / "ckpt-iter0002", ("critic", "critic_target"))


@pytest.mark.slow
def test_a_run_killed_during_bcs_evaluation_resumes_at_the_evaluation_not_bc(tmp_path, make_cfg, monkeypatch):
    extra = ("curriculum.warmup_iters=0", "curriculum.mixed_iters=1", "curriculum.ppo_iters=0",
             "env.eval_episodes=2", "rollout.eval_sampled_temperature=1.0", "env.kwargs={max_turns: 4}")
    straight = tmp_path / "straight"
    Trainer(make_cfg(straight, *extra)).run()
    assert "pending_eval" not in json.loads((straight / "ckpt-bc" / "trainer_state.json").read_text())

    killed = tmp_path / "killed"
    run = HeldOut.run

    def killed_in_sampled(self, tag, **kw):  # the greedy evaluation logged, the sampled one killed
        if tag == "bc_sampled":
            raise KeyboardInterrupt
        return run(self, tag, **kw)

    monkeypatch.setattr(HeldOut, "run", killed_in_sampled)
    with pytest.raises(KeyboardInterrupt):
        Trainer(make_cfg(killed, *extra)).run()
    monkeypatch.setattr(HeldOut, "run", run)
    assert (killed / "latest").read_text() == "ckpt-bc"  # BC's weights kept, before its evaluation
    state = json.loads((killed / "ckpt-bc" / "trainer_state.json").read_text())
    assert state["pending_eval"] == "bc" and state["eval"] == {} and state["phase"] == "rl"
    assert "eval_bc" in [r["phase"] for r in read_metrics(killed / "metrics.jsonl")]  # logged before the kill
    tr = Trainer(make_cfg(killed, *extra), resume=True)
    spent_bc = tr.state.phase_s["bc"]
    summary = tr.run()
    assert summary["phase_s"]["bc"] == spent_bc  # BC did not run again
    assert summary["eval"] == json.loads((straight / "summary.json").read_text())["eval"]
    assert_same_weights(straight / "ckpt-final", killed / "ckpt-final")
    got = [(r["step"], r["phase"]) for r in read_metrics(killed / "metrics.jsonl")]
    assert got == [(r["step"], r["phase"]) for r in read_metrics(straight / "metrics.jsonl")]  # no record twice
