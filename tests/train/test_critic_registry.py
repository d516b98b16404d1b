"""The critic kinds' registry: one class per ``critic.kind``, each refusing the settings it cannot run, before a run
makes anything."""

from __future__ import annotations

import typing

import pytest

from polyturn.config import CriticConfig, load_config
from polyturn.train.critics import CRITICS, CriticLearner, check_critic
from polyturn.train.trainer import Trainer, check_run


def test_every_critic_kind_has_a_learner():
    kinds = typing.get_args(CriticConfig.model_fields["kind"].annotation)
    assert sorted(CRITICS) == sorted(kinds)
    assert all(issubclass(c, CriticLearner) for c in CRITICS.values())


@pytest.mark.parametrize("sets, needle", [
    (["ppo.algo=critic_rft"], "critic.kind=action"),
    (["rollout.best_of=3"], "reads an action-level critic"),
    (["critic.branch_states=2"], "critic.branch_states=0"),
    (["critic.kind=none", "critic.encoder=causal"], "critic.encoder=scratch"),
    (["critic.kind=shared", "ppo.algo=rft"], "critic.kind=separate"),
    (["critic.kind=action", "critic.branch_states=2", "rollout.workers=1", "rollout.num_envs=2"],
     "rollout.workers=0"),
])
def test_a_kind_refuses_what_it_cannot_run(sets, needle):
    with pytest.raises(ValueError, match="critic") as e:
        check_critic(load_config(None, sets))
    assert needle in str(e.value)


@pytest.mark.parametrize("sets, needle", [
    (["critic.target=td"], "critic.target=gae"),
    (["critic.kind=action"], "critic.kind = action"),
    (["critic.kind=action", "ppo.algo=turn_dpo"], "critic.kind = action"),
    (["rollout.workers=1", "rollout.num_envs=2"], "rollout.workers=0"),
])
def test_one_process_settings_are_refused_under_torchrun(sets, needle):
    cfg = load_config(None, sets)
    check_run(cfg)  # one process: fine
    with pytest.raises(ValueError, match="--nproc 2") as e:
        check_run(cfg, world_size=2)
    assert needle in str(e.value)


def test_allowed_combinations_pass():
    for sets in (["ppo.algo=rft", "critic.kind=separate"], ["ppo.algo=rft", "critic.kind=none"],
                 ["critic.kind=action", "ppo.algo=critic_rft", "rollout.best_of=2"], ["critic.kind=shared"]):
        check_run(load_config(None, sets))


def test_the_trainer_refuses_before_it_makes_anything(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="critic.kind=action"):
        Trainer(load_config(None, [f"run.out_dir={out}", "ppo.algo=critic_pg"]))
    assert not out.exists()
