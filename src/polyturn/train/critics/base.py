"""What the trainer asks of a critic (:class:`CriticLearner`), and the helpers every kind shares.

Every kind follows one rule for the state after an episode's last turn
(:func:`bootstraps`, docs/ARCHITECTURE.md "Episode ends and bootstrapping").
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from polyturn.algos.baselines import group_relative_advantages
from polyturn.algos.gae import turn_gae
from polyturn.config import ACTION_ALGOS, TrainConfig
from polyturn.models.actor import Actor
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.types import Episode, Turn
from polyturn.runtime import CPU, Runtime
from polyturn.train.batch import TokenBatch


def clip_args(old_values: torch.Tensor, clip_range: float | None) -> dict:
    """Value-clipping arguments for :func:`value_loss`: both or neither."""
    return {"old_values": old_values, "clip_range": clip_range} if clip_range is not None else {}


def turn_tensors(episodes: Sequence[Episode]) -> dict[str, torch.Tensor]:
    """``rewards``, ``terminated``, ``truncated``, ``mask``, ``durations`` as ``[E, T]`` (T the longest episode).

    ``durations``: the env steps each turn lasted, ``turn.info["duration"]`` (1 when absent, and on padding). A
    hierarchical agent's manager turn spans its option's worker steps; its reward is then their discounted sum
    (:func:`polyturn.algos.gae.semi_mdp_rewards`) and it discounts by ``gamma ** duration`` (:func:`turn_discounts`).
    """
    e, t = len(episodes), max(len(ep.turns) for ep in episodes)
    out = {k: torch.zeros(e, t) for k in ("rewards", "terminated", "truncated", "mask")}
    out["durations"] = torch.ones(e, t)
    for i, ep in enumerate(episodes):
        for j, turn in enumerate(ep.turns):
            out["rewards"][i, j] = turn.reward
            out["terminated"][i, j] = float(turn.terminated)
            out["truncated"][i, j] = float(turn.truncated and not turn.terminated)
            out["mask"][i, j] = 1.0
            out["durations"][i, j] = turn_duration(turn, where=f"episode {i} turn {j}")
    return out


def turn_duration(turn: Turn, *, where: str) -> int:
    """The env steps ``turn`` lasted: ``turn.info["duration"]``, an int >= 0 (1 when absent; 0 for a hierarchical
    manager's turn that set nothing, after which no time passed); ``where`` names the turn in the error."""
    d = turn.info.get("duration", 1)
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0:
        raise ValueError(f"Expected info['duration'] of {where} to be an int >= 0 (the env steps the turn lasted), "
                         f"got {d!r}; have the env report each option's step count, or leave it out for one step")
    return int(d)


def turn_discounts(tt: dict[str, torch.Tensor], gamma: float) -> float | torch.Tensor:
    """The ``gamma`` that :func:`turn_gae` takes for ``tt``: ``gamma ** durations`` ``[E, T]`` where some turn lasts
    more than one env step (a semi-MDP), else ``gamma`` itself, so a run of one-step turns keeps its exact numbers."""
    d = tt["durations"]
    return gamma ** d if bool((d != 1).any()) else gamma


def bootstraps(ep: Episode) -> bool:
    """Whether credit assignment bootstraps from V of the state after ``ep``'s last turn.

    Only a truncation that is not part of the task does. A terminated episode has
    nothing after it. The env's own turn limit is part of the task: the state
    counts the turns left (feature ``turns_left``) and the env scores reaching it
    as an outcome (``outcome/timeout``), so the state after it, with no turn left,
    is worth exactly 0 and no critic is asked (it never trains on such a state).
    A truncation whose final state still has turns left (or that does not count
    them) cut a task that could have gone on: V of that state stands in for the rest.
    """
    return ep.truncated and ep.final_features.get("turns_left", 1.0) > 0


def state_input(ep: Episode, t: int) -> CriticInput:
    """The critic's view of the state before turn ``t`` (``t == len(turns)``: the state after the last turn)."""
    if t < len(ep.turns):
        turn = ep.turns[t]
        return CriticInput(
            task=ep.question, history=ep.history(t), privileged=turn.privileged, action=turn.action,
            features=turn.features,
        )
    return CriticInput(
        task=ep.question, history=ep.history(t), privileged=ep.final_privileged, action=None,
        features=ep.final_features,
    )


class CriticLearner:
    """What the trainer asks of a critic; this base class is the critic-free baseline's (values 0, no training).

    * :meth:`values` — ``V(s_t)`` and ``V(s_{t+1})`` for GAE (no grad);
    * :meth:`advantages` — per-turn advantages and returns (turn-level GAE here);
    * :attr:`task_group` — episodes collected per task (several for baselines and pairs that compare them);
    * :meth:`update` — the critic's own optimizer steps on the batch's targets;
    * :meth:`actor_loss`, :meth:`joint_parameters`, :meth:`joint_optimizer` —
      loss terms the actor's step adds, and the parameters and optimizer that
      step then also clips and steps (a critic that shares the actor's trunk);
    * :meth:`optimizers`, :meth:`save`, :meth:`load` — checkpoint state.
    """

    kind = "none"
    runtime: Runtime = CPU
    #: Whether :meth:`update` reads only its arguments and the critic's own modules, never the actor (nor state the
    #: next collection sets): the trainer may then run it beside the next iteration's sampling.
    update_apart = False

    @classmethod
    def check(cls, cfg: TrainConfig, *, world_size: int = 1) -> None:
        """Refuse settings this kind cannot run, with a ``ValueError`` naming the field and the fix (called before a
        run makes anything; ``world_size``: torchrun processes). Only an action-level critic ranks candidate turns,
        so every other kind refuses the settings that read one."""
        c = cfg.critic
        needs = [f"ppo.algo = '{cfg.ppo.algo}'"] if cfg.ppo.algo in ACTION_ALGOS else []
        by_critic = cfg.rollout.best_of > 1 and cfg.rollout.best_of_rank == "action_critic"
        needs += [f"rollout.best_of = {cfg.rollout.best_of}"] if by_critic else []
        if needs:
            raise ValueError(f"{' and '.join(needs)} reads an action-level critic, got critic.kind = '{c.kind}'; "
                             "set critic.kind=action (or ppo.algo=ppo, rollout.best_of=1, or rollout.best_of_rank=cost "
                             "with constraints)")
        if c.branch_states:
            raise ValueError(f"critic.branch_states = {c.branch_states} labels turns for an action-level critic, got "
                             f"critic.kind = '{c.kind}'; set critic.kind=action or critic.branch_states=0")
        if c.encoder == "causal":
            raise ValueError(f"critic.encoder = 'causal' scores candidate turns: it needs critic.kind=action, got "
                             f"critic.kind = '{c.kind}'; set critic.kind=action or critic.encoder=scratch")

    @classmethod
    def build(cls, cfg: TrainConfig, *, demos: Sequence[dict], actor: Actor,
              feature_names: Sequence[str] | None) -> CriticLearner:
        """The learner of ``cfg.critic`` for a run on ``demos`` (its tokenizer's corpus) beside ``actor``."""
        return cls()

    def collect_extra(self, collector: Any, tasks: Sequence[dict], episodes: Sequence[Episode], *, rng: Any,
                      temperature: float, generator: torch.Generator | None) -> dict[str, float]:
        """What the kind plays beyond the iteration's batch before its update, and the metrics of it (the action
        critic's branches); nothing here."""
        return {}

    def scorer(self) -> Callable[[Sequence[CriticInput]], list[float]] | None:
        """Scores of candidate turns for best-of-n collection (``rollout.best_of``), or None when the kind rates
        none."""
        return None

    def to(self, runtime: Runtime) -> None:
        """Move the critic's modules to ``runtime.device``; its forward passes then run under its autocast.

        Values come back to the host as float32 ``[E, T]`` (GAE is tiny and runs there).
        """
        self.runtime = runtime

    def values(self, episodes: Sequence[Episode], batch: TokenBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, next_values)``, both ``[E, T]``, for :func:`polyturn.algos.gae.turn_gae`."""
        tt = turn_tensors(episodes)
        z = torch.zeros_like(tt["rewards"])
        return z, z

    @property
    def task_group(self) -> int:
        """Episodes the trainer collects per task seed."""
        return 1

    @property
    def has_values(self) -> bool:
        """Whether :meth:`values` are state values worth an explained-variance figure."""
        return True

    def advantages(self, episodes: Sequence[Episode], tt: dict[str, torch.Tensor], values: torch.Tensor,
                   next_values: torch.Tensor, *, gamma: float, lam: float,
                   reward_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` ``[E, T]`` from the batch's (reward-scaled) ``tt``: turn-level GAE (semi-MDP
        turns discount by ``gamma ** duration``)."""
        return turn_gae(tt["rewards"], values, next_values, tt["terminated"], tt["mask"],
                        gamma=turn_discounts(tt, gamma), lam=lam)

    def update(self, episodes: Sequence[Episode], returns: torch.Tensor, old_values: torch.Tensor, *, gamma: float,
               reward_scale: float = 1.0, with_actor: bool = False) -> dict[str, float]:
        """Train on the batch's return targets (already reward-scaled); returns logged metrics.

        ``with_actor``: an actor step follows on this batch (a learner that trains
        inside it, through :meth:`actor_loss`, skips its own update then).
        """
        return {}

    def actor_loss(self, episodes: Sequence[Episode], batch: TokenBatch, hidden: torch.Tensor, returns: torch.Tensor,
                   old_values: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Loss terms to add to the actor's loss on a minibatch (None: none), and their metrics."""
        return None, {}

    def joint_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters that :meth:`actor_loss` trains inside the actor's step (clipped with the actor's)."""
        return []

    def joint_optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer of :meth:`joint_parameters`, stepped with the actor's."""
        return None

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Optimizers whose state a checkpoint keeps, by name."""
        return {}

    def save(self, directory: Path) -> None:
        """Write the critic's part of a checkpoint into ``directory`` (nothing for the critic-free baseline)."""

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote (before the optimizer states are loaded into :meth:`optimizers`)."""


def task_groups(episodes: Sequence[Episode]) -> torch.Tensor:
    """``[E]`` integer group ids: the attempts at one task (an episode's seed is its task's) in one role (a
    multi-role game's seats are baselined apart: per-role baselines)."""
    ids: dict[tuple, int] = {}
    return torch.tensor([ids.setdefault((ep.seed, ep.role), len(ids)) for ep in episodes])


def episode_advantages(episodes: Sequence[Episode], reward_scale: float) -> torch.Tensor:
    """``[E]``: each episode's (scaled) return against the other attempts at its task in its role (RLOO)."""
    rets = torch.tensor([ep.episode_return for ep in episodes]) * reward_scale
    return group_relative_advantages(rets, task_groups(episodes))
