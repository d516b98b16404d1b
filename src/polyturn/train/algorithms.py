"""The policy updates (config ``ppo.algo``) behind one interface, so the trainer loop never asks which it runs.

Each :class:`PolicyUpdate` says which episodes and per-turn weights the actor
step reads (:meth:`PolicyUpdate.select`), how many passes it makes, and the
token-level loss of a micro-batch (:meth:`PolicyUpdate.loss`). The policy's
minibatch loop (:meth:`polyturn.train.policy.Policy.update_actor`) is
shared by all but turn-level DPO, which samples candidate turns and has its own
step (:mod:`polyturn.train.turn_dpo`).

| algo | episodes | per-turn weight | loss |
|---|---|---|---|
| ppo | all | advantage (GAE, group-relative, or the action critic's score) | PPO-clip |
| a2c | all | advantage | A2C, one pass |
| rft | successful | 1 (0 for turns the env answered with an error or marked wasted, with ``rft_skip_error_turns`` / ``rft_skip_wasted_turns``) | NLL (imitation); with ``error_unlikelihood``, plus -log(1 - p(action)) on every sampled episode's error turns |
| critic_pg | all | the action critic's score, normalised per batch | REINFORCE, one pass |
| critic_rft | all (``awr_successes_only``: rft's) | ``min(exp(A / T), max)`` of the action critic's score (AWR; rescaled to mean 1 per episode with ``awr_successes_only``) | weighted NLL |
| turn_dpo | states of all | — | DPO on candidate pairs + NLL |

``ppo.refusal_pairs`` adds, beside each minibatch of the updates above (not turn_dpo), DPO of the expert's refusal
over the forbidden write at the states the env marks forbidden (:mod:`polyturn.train.refusals`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from polyturn.algos.ppo import a2c_loss, ppo_loss
from polyturn.algos.preference import awr_weights
from polyturn.config import PPOConfig, TrainConfig
from polyturn.rollout.types import Episode
from polyturn.train.batch import PolicyOutput, TokenBatch
from polyturn.train.policy import Policy
from polyturn.train.refusals import RefusalTerm
from polyturn.train.reporting import ignore_steps


class PolicyUpdate:
    """``ppo.algo: ppo``: token-level PPO-clip on every episode with its own advantages (and, with
    ``ppo.kl_coef > 0``, a KL penalty to the frozen reference policy, whose log-probs ``loss`` then gets)."""

    #: Whether the update imitates chosen episodes (rft) instead of following their advantages: under
    #: ``constraints`` the chosen episodes are then filtered and weighted by their costs (:meth:`update`), where the
    #: others read advantages already penalised by them (``Policy.learn``).
    imitates = False

    def __init__(self, cfg: PPOConfig) -> None:
        self.cfg = cfg

    @classmethod
    def check(cls, cfg: TrainConfig, *, world_size: int = 1) -> None:
        """Refuse settings this update cannot run (``ValueError`` naming the field and the fix); ``world_size``:
        torchrun processes."""

    @property
    def epochs(self) -> int:
        """Passes over the selected episodes."""
        return self.cfg.epochs

    def select(self, episodes: Sequence[Episode], adv: torch.Tensor,
               mask: torch.Tensor) -> tuple[list[int], torch.Tensor, dict[str, float]]:
        """The episodes the step trains on (indices), the ``[E, T]`` per-turn weights it reads, and metrics."""
        return list(range(len(episodes))), adv, {}

    def loss(self, po: PolicyOutput, batch: TokenBatch, adv_tok: torch.Tensor, *, ent_coef: float,
             ref_logprobs: torch.Tensor | None, prox_logprobs: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The micro-batch's policy loss and diagnostics (``loss`` first); ``prox_logprobs``: the proximal
        policy's log-probs of the batch's tokens with ``ppo.decoupled`` (:func:`~polyturn.algos.ppo.ppo_loss`)."""
        p = self.cfg
        decoupled = dict(behaviour_logprobs=batch.old_logprobs,
                         behaviour_weight_cap=p.behaviour_weight_cap) if prox_logprobs is not None else {}
        return ppo_loss(po.logprobs, batch.old_logprobs if prox_logprobs is None else prox_logprobs, adv_tok,
                        batch.action_mask, clip_eps=p.clip, dual_clip=p.dual_clip, entropy=po.entropy,
                        ent_coef=ent_coef, ref_logprobs=ref_logprobs, kl_coef=p.kl_coef, **decoupled)

    def update(self, policy: Policy, episodes: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
               values: torch.Tensor, mask: torch.Tensor, **kw: Any) -> dict[str, float]:
        """One update of ``policy`` on the iteration's episodes (``kw``: temperature, ent_coef, w_bc, w_rl)."""
        chosen, adv_chosen, metrics = self.select(episodes, adv, mask)
        if self.imitates and policy.constraints is not None:  # never imitate an episode over a cost limit
            chosen, adv_chosen = policy.constraints.imitated(episodes, chosen, adv_chosen, metrics)
        negatives = self.negatives(episodes, mask, metrics)
        refusals = (RefusalTerm.build(policy, episodes, temperature=kw["temperature"], metrics=metrics,
                                      progress=kw.get("progress", ignore_steps))
                    if self.cfg.refusal_pairs is not None else None)  # DPO of refusals over forbidden writes
        if chosen or negatives is not None or refusals is not None:
            metrics.update(policy.update_actor(self, [episodes[i] for i in chosen], adv_chosen[chosen],
                                               returns[chosen], values[chosen], negatives=negatives, beside=refusals,
                                               **kw))
        if refusals is not None:
            metrics.update(refusals.after())
        return metrics

    def negatives(self, episodes: Sequence[Episode], mask: torch.Tensor,
                  metrics: dict[str, float]) -> tuple[list[Episode], torch.Tensor] | None:
        """The episodes whose turns the update pushes down, with their ``[N, T]`` 0/1 turn mask (None: none)."""
        return None


class A2C(PolicyUpdate):
    """``ppo.algo: a2c``: one pass, no clipping."""

    @property
    def epochs(self) -> int:
        return 1

    def loss(self, po: PolicyOutput, batch: TokenBatch, adv_tok: torch.Tensor, *, ent_coef: float,
             ref_logprobs: torch.Tensor | None, prox_logprobs: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return a2c_loss(po.logprobs, adv_tok, batch.action_mask, entropy=po.entropy, ent_coef=ent_coef)


class RFT(A2C):
    """``ppo.algo: rft``: rejection-sampling fine-tuning: imitate the successful episodes (``epochs`` passes).

    Each kept turn is weighted 1, which makes the policy-gradient loss the token-mean NLL of their actions: the
    policy imitates what worked and never pushes a sampled action down. With ``ppo.rft_valid_only`` a success
    that contains an invalid action is dropped too; with ``constraints``, one over a cost limit.
    """

    imitates = True

    @property
    def epochs(self) -> int:
        return self.cfg.epochs

    def select(self, episodes: Sequence[Episode], adv: torch.Tensor,
               mask: torch.Tensor) -> tuple[list[int], torch.Tensor, dict[str, float]]:
        valid_only = self.cfg.rft_valid_only
        kept = [i for i, ep in enumerate(episodes) if ep.success and (not valid_only or all(t.valid for t in ep.turns))]
        metrics = {"rft/kept": len(kept)}
        for flag in skipped_flags(self.cfg):
            clean = turns_without(episodes, mask, flag)
            metrics[f"rft/{flag}_turns_skipped"] = float((mask[kept] > 0).sum() - (clean[kept] > 0).sum())
            mask = clean
        return kept, mask, metrics

    def negatives(self, episodes: Sequence[Episode], mask: torch.Tensor,
                  metrics: dict[str, float]) -> tuple[list[Episode], torch.Tensor] | None:
        """With ``ppo.error_unlikelihood``: every episode with a turn the env answered with an error (not one
        epsilon forced), and those turns, for the update's unlikelihood term."""
        if not self.cfg.error_unlikelihood:
            return None
        errors = flagged_turns(episodes, mask, "error", forced=False)
        rows = [i for i in range(len(episodes)) if errors[i].any()]
        metrics.update({"rft/error_turns_pushed": float(errors.sum()), "rft/error_episodes": float(len(rows))})
        return ([episodes[i] for i in rows], errors[rows]) if rows else None


def skipped_flags(cfg: PPOConfig) -> list[str]:
    """The turn flags (``info`` keys) whose turns rft imitates with weight 0: ``error`` and/or ``wasted``."""
    return [flag for flag in ("error", "wasted") if getattr(cfg, f"rft_skip_{flag}_turns")]


def turns_without(episodes: Sequence[Episode], mask: torch.Tensor, flag: str = "error") -> torch.Tensor:
    """``mask`` (``[E, T]`` turn weights) with 0 at every turn whose step info sets ``flag``: ``"error"`` (an
    invalid, failed or refused call, a repeat) or ``"wasted"`` (a valid call the env marked pointless)."""
    out = mask.clone()
    out[flagged_turns(episodes, mask, flag) > 0] = 0
    return out


def flagged_turns(episodes: Sequence[Episode], mask: torch.Tensor, flag: str = "error", *,
                  forced: bool = True) -> torch.Tensor:
    """``[E, T]`` 0/1: 1 at every turn of ``mask`` whose step info sets ``flag`` (``forced=False``: not the turns
    epsilon exploration forced)."""
    out = torch.zeros_like(mask)
    for i, ep in enumerate(episodes):
        for t, turn in enumerate(ep.turns[: out.shape[1]]):
            if turn.info.get(flag) and (forced or not turn.forced) and mask[i, t] > 0:
                out[i, t] = 1
    return out


class CriticPG(A2C):
    """``ppo.algo: critic_pg``: REINFORCE with the action critic's per-turn score (normalised per batch)."""


class CriticRFT(RFT):
    """``ppo.algo: critic_rft``: every turn imitated with its advantage-weighted-regression weight (turn-level AWR)."""

    def select(self, episodes: Sequence[Episode], adv: torch.Tensor,
               mask: torch.Tensor) -> tuple[list[int], torch.Tensor, dict[str, float]]:
        for flag in skipped_flags(self.cfg):
            mask = turns_without(episodes, mask, flag)
        w = awr_weights(adv, mask, temperature=self.cfg.awr_temperature, max_weight=self.cfg.awr_max_weight)
        chosen, metrics = list(range(len(episodes))), {}
        if self.cfg.awr_successes_only:  # rft's episodes, each one's weights rescaled to mean 1 over its turns
            chosen, _, metrics = super().select(episodes, adv, mask)
            w = w * mask.to(w.dtype).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1e-12)
        kept, n = w[chosen], mask[chosen].sum().clamp_min(1)
        metrics.update({"awr/weight_mean": float(kept.sum() / n),
                        "awr/weight_max": float(kept.max()) if kept.numel() else 0.0})
        return chosen, w, metrics


#: The updates that run the shared minibatch loop, by ``ppo.algo`` (turn_dpo: :mod:`polyturn.train.turn_dpo`).
PG_UPDATES: dict[str, type[PolicyUpdate]] = {"ppo": PolicyUpdate, "a2c": A2C, "rft": RFT, "critic_pg": CriticPG,
                                             "critic_rft": CriticRFT}
