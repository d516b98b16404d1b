"""Resume is exact: a run stopped after an iteration and resumed ends where the uninterrupted run ends."""

from __future__ import annotations

import pytest

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
