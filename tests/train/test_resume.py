"""Resume is exact: a run stopped after an iteration and resumed ends where the uninterrupted run ends."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyturn.models.critic import SeparateCritic
from polyturn.train.trainer import Trainer


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.slow
def test_resume_with_td_targets_is_exact(tmp_path, make_cfg):
    extra = ("curriculum.warmup_iters=1", "curriculum.mixed_iters=0", "curriculum.ppo_iters=1",
             "critic.target=td", "critic.minibatch=8", "env.eval_episodes=1")
    straight = tmp_path / "straight"
    Trainer(make_cfg(straight, *extra)).run()
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    (resumed / "latest").write_text("ckpt-iter0001")
    for d in ("ckpt-iter0002", "ckpt-final"):
        shutil.rmtree(resumed / d)
    tr = Trainer(make_cfg(resumed, *extra), resume=True)
    assert tr.state["iter"] == 1
    tr.run()
    a, b = straight / "ckpt-iter0002", resumed / "ckpt-iter0002"
    for k, v in _weights(AutoModelForCausalLM.from_pretrained(a / "actor")).items():
        assert torch.equal(v, AutoModelForCausalLM.from_pretrained(b / "actor").state_dict()[k]), k
    for part in ("critic", "critic_target"):
        wa, wb = _weights(SeparateCritic.from_pretrained(a / part)), _weights(SeparateCritic.from_pretrained(b / part))
        assert all(torch.equal(v, wb[k]) for k, v in wa.items()), part
