"""The policy updates by their ``ppo.algo`` name, and the checks a run passes before it makes anything."""

from __future__ import annotations

from polyturn.config import TrainConfig
from polyturn.train.algorithms import PG_UPDATES, PolicyUpdate
from polyturn.train.constraints import check_constraints
from polyturn.train.critics import check_critic
from polyturn.train.judge_term import check_judge
from polyturn.train.offline import check_offline
from polyturn.train.refusals import check_refusals
from polyturn.train.remote import check_workers
from polyturn.train.turn_dpo import TurnDPO

#: Every policy update by its ``ppo.algo`` name.
POLICY_UPDATES: dict[str, type[PolicyUpdate]] = {**PG_UPDATES, "turn_dpo": TurnDPO}


def check_run(cfg: TrainConfig, *, world_size: int = 1) -> None:
    """``ValueError`` naming the field and the fix when ``cfg`` asks for what a run cannot do (its critic kind's,
    policy update's, rollout workers', constraints' (these make one env to read its cost terms), refusal pairs', the
    offline phase's and the judge term's own checks), before the run makes anything."""
    check_critic(cfg, world_size=world_size)
    POLICY_UPDATES[cfg.ppo.algo].check(cfg, world_size=world_size)
    check_workers(cfg, world_size=world_size)
    check_constraints(cfg)
    check_refusals(cfg, world_size=world_size)
    check_offline(cfg, world_size=world_size)
    check_judge(cfg.judge, world_size=world_size)
