"""A trainable policy: its actor, optimizer, frozen reference, guarded step and BC loss, and the RL actor step.

A run holds one :class:`Policy` per role (one, ``agent``, for a single-agent environment; self-play may hold one
per role, or one that plays every role). The policy updates of :mod:`polyturn.train.algorithms` call only the
public methods here; the trainer's own members are none of their business.

The RL actor step (:meth:`Policy.update_actor`) is the minibatch loop shared by the policy-gradient updates:
token-level PPO-clip (or A2C, or rft's imitation) over length-sorted micro-batches, early-stopped on approx_kl.

Simplifications, stated as nanochat's RL script states its own:

* old log-probs are the behaviour log-probs recorded at sampling time (the
  incremental decoder reproduces the training forward to ~1e-6, tested), so
  no extra forward pass recomputes them;
* epsilon-exploration turns are trained on like sampled ones, with the
  policy's own log-probs of the forced ids as old log-probs;
* BC checkpoints are written at the end of BC only: a run killed during BC
  restarts BC on resume;
* dropout (e.g. LoRA dropout) acts in phase-1 BC only, as regularisation of a
  supervised fit; every RL update runs the actor in eval mode (the mixed
  phase's BC term included), so PPO's ratio is exactly new/old policy and is
  1 on the first minibatch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from polyturn.algos.bc import action_unlikelihood, bc_loss
from polyturn.algos.gae import normalize
from polyturn.algos.value import explained_variance
from polyturn.config import TrainConfig
from polyturn.models.actor import Actor, load_actor
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.types import Episode, Segment
from polyturn.runtime import Runtime
from polyturn.train import distributed
from polyturn.train.batch import (
    MicroStats,
    PolicyOutput,
    TokenBatch,
    action_tokens,
    make_token_batch,
    micro_batches,
    policy_output,
    segment_advantages,
    shareable_prefix,
)
from polyturn.train.constraints import Constraints
from polyturn.train.critic_beside import timed_update
from polyturn.train.critics import CriticLearner, turn_tensors
from polyturn.train.guard import guarded_step
from polyturn.train.reporting import SubProgress, ignore_steps
from polyturn.train.state import RunState

#: A PPO minibatch whose approx_kl (measured before its step) passes this multiple of ppo.target_kl is not
#: stepped, and the update ends there (SB3 stops at 1.5x; the epoch-mean limit of ppo.target_kl also applies).
KL_STOP = 2.0


class NonFiniteError(RuntimeError):
    """A loss or gradient was not finite and ``run.on_nonfinite`` is ``stop``."""


class PolicyUpdateLike(Protocol):
    """A policy update (:class:`polyturn.train.algorithms.PolicyUpdate`): one update of a policy on its episodes."""

    #: Whether it imitates chosen episodes (rft) rather than follow advantages: constraints then filter and weight
    #: the imitated episodes (``Constraints.imitated``) instead of penalising the advantages.
    imitates: bool

    def update(self, policy: Policy, episodes: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
               values: torch.Tensor, mask: torch.Tensor, **kw: Any) -> dict[str, float]: ...


class TokenLoss(Protocol):
    """The token-level loss of a policy update (:class:`polyturn.train.algorithms.PolicyUpdate`)."""

    @property
    def epochs(self) -> int: ...

    def loss(self, po: PolicyOutput, batch: TokenBatch, adv_tok: torch.Tensor, *, ent_coef: float,
             ref_logprobs: torch.Tensor | None, prox_logprobs: torch.Tensor | None = None) -> dict[str, torch.Tensor]: ...


class Policy:
    """One trainable policy (see the module docstring).

    Args:
        name: the role it is trained as (``agent`` for a single-agent run); its optimizer steps are counted under
            this name in the run state.
        actor: the actor, already on the run's device.
        critic: the critic learner whose terms join the actor's step (a shared critic's value head).
        demos: the demonstrations' token segments, for the BC loss.
        cfg, runtime, state: the run's config, device and precision, and position.
        settings: how it samples (rollout settings).
        py_rng: the run's Python RNG (minibatch order, demonstrations drawn for the mixed phase's BC term).
        gen: the run's sampling generator (updates that sample candidate turns draw from it).
        on_message: where a skipped update is reported.
        constraints: constrained RL's multipliers and cost critics (config ``constraints``), or None.
    """

    def __init__(self, *, name: str, actor: Actor, critic: CriticLearner, demos: list[list[Segment]],
                 cfg: TrainConfig, runtime: Runtime, state: RunState, settings: RolloutSettings, py_rng: random.Random,
                 gen: torch.Generator, on_message: Callable[[str], None],
                 constraints: Constraints | None = None) -> None:
        self.name = name
        self.constraints = constraints
        self.settings = settings
        self.gen = gen
        self.actor = actor
        self.critic = critic
        self.demos = demos
        self.cfg = cfg
        self.runtime = runtime
        self.state = state
        self.py_rng = py_rng
        self.on_message = on_message
        self.scaler = runtime.grad_scaler()  # fp16 only
        self.opt = self.make_optimizer()
        self.ref_actor: Actor | None = None

    def restore(self, directory: Path) -> None:
        """On resume: the critic's (and the cost critics') parts from checkpoint ``directory``, and a fresh actor
        optimizer, before the checkpoint's optimizer states are loaded into them."""
        self.critic.load(directory)
        if self.constraints is not None:
            self.constraints.load(directory)
        self.opt = self.make_optimizer()

    def make_optimizer(self) -> torch.optim.Optimizer:
        """A fresh AdamW over the actor's trainable parameters at ``actor.lr``."""
        return torch.optim.AdamW(self.actor.trainable_parameters(), lr=self.cfg.actor.lr)

    @property
    def steps(self) -> int:
        """RL optimizer steps taken so far (kept in the run state, so resume continues the warm-up)."""
        return self.state.actor_steps.get(self.name, 0)

    def lr_factor(self) -> float:
        """Linear warm-up over the first RL optimizer steps."""
        warm = self.cfg.actor.warmup_steps
        return min(1.0, (self.steps + 1) / warm) if warm else 1.0

    def begin_step(self) -> None:
        """Set the warm-up learning rate for the next RL step and count it."""
        for g in self.opt.param_groups:
            g["lr"] = self.cfg.actor.lr * self.lr_factor()
        self.state.actor_steps[self.name] = self.steps + 1

    # ---- one optimizer step -----------------------------------------------------------------
    def step(self, loss: torch.Tensor | Iterable[torch.Tensor], opt: torch.optim.Optimizer, params: list,
             max_norm: float, *, where: str, extra_opt: torch.optim.Optimizer | None = None,
             proceed: Callable[[], bool] | None = None) -> tuple[bool | None, float]:
        """:func:`polyturn.train.guard.guarded_step`; a non-finite loss or gradient skips or stops, per config.

        Returns (True: stepped, False: skipped, None: declined by ``proceed``) and the gradient norm.
        """
        opts = [o for o in (opt, extra_opt) if o is not None]
        outcome, norm = guarded_step(loss, opts, params, max_norm, scaler=self.scaler, proceed=proceed)
        if outcome == "declined":
            return None, norm
        if outcome == "nonfinite_loss":
            return self._nonfinite(f"loss at {where}"), norm
        if outcome == "nonfinite_grad":
            return self._nonfinite(f"gradient at {where}"), norm
        return outcome == "ok", norm

    def _nonfinite(self, what: str) -> bool:
        if self.cfg.run.on_nonfinite == "stop":
            raise NonFiniteError(f"Non-finite {what}; stopping (run.on_nonfinite = stop). Weights were not updated.")
        self.state.skipped += 1
        self.on_message(f"skipped an update: non-finite {what}")
        return False

    # ---- behaviour cloning -----------------------------------------------------------------
    def bc_loss(self, idx: Sequence[int], acc: MicroStats, *, weight: float = 1.0) -> Iterator[torch.Tensor]:
        """``weight`` x the BC loss of demonstrations ``idx``, as micro-batch losses (see :meth:`update_actor`).

        Each is weighted by its share of the batch's action tokens (``bc_loss`` is a token mean);
        ``losses/bc_loss`` and ``bc/token_accuracy`` of the whole batch go into ``acc``.
        """
        demos = [self.demos[i] for i in idx]
        n_act = max(1, sum(action_tokens(segs) for segs in demos))
        for micro in distributed.shard(self._micro_batches(demos)):
            sub = [demos[k] for k in micro]
            acc.count([[len(s) for s in segs] for segs in sub])
            batch = make_token_batch([(j, seg) for j, segs in enumerate(sub) for seg in segs],
                                     pad_id=self.actor.pad_id, device=self.runtime.device,
                                     share_prefix=self.cfg.actor.shared_prefix)
            po = policy_output(self.actor, batch)
            out = bc_loss(po.logprobs, batch.action_mask, correct=po.correct)
            share = sum(action_tokens(segs) for segs in sub) / n_act
            acc.add({"losses/bc_loss": out["loss"], "bc/token_accuracy": out["token_accuracy"]}, share)
            yield weight * share * out["loss"]

    def bc_term(self, n: int, acc: MicroStats, *, weight: float) -> Iterator[torch.Tensor]:
        """The mixed phase's BC term beside a minibatch of ``n`` episodes: as many demonstrations, drawn at random."""
        idx = self.py_rng.sample(range(len(self.demos)), min(n, len(self.demos)))
        return self.bc_loss(idx, acc, weight=weight)

    # ---- the RL actor step -------------------------------------------------------------------
    def update_actor(self, algo: TokenLoss, episodes: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
                     old_values: torch.Tensor, *, temperature: float, ent_coef: float, w_bc: float, w_rl: float,
                     negatives: tuple[Sequence[Episode], torch.Tensor] | None = None,
                     beside: Callable[[MicroStats], Iterable[torch.Tensor]] | None = None,
                     progress: SubProgress = ignore_steps) -> dict[str, float]:
        """Token-level PPO-clip (or ``algo``'s loss) over minibatches of episodes, early-stopped on approx_kl.

        ``negatives`` (rft's ``ppo.error_unlikelihood``): episodes and their ``[N, T]`` 0/1 turns to push down;
        beside each minibatch, ``minibatch_episodes`` of them drawn at random add the unlikelihood term (a
        minibatch of it alone when ``episodes`` is empty). ``beside`` (``ppo.refusal_pairs``): a term added to every
        minibatch, as micro-batch losses given the minibatch's statistics (a minibatch of it alone likewise).
        The mixed phase's BC term (``w_bc``) joins every minibatch, with as many demonstrations as it has episodes,
        ``ppo.minibatch_episodes`` of them in a minibatch of such a term alone: an update never runs without the
        demonstrations' anchor.

        A minibatch's forward and backward run in length-sorted micro-batches of at most
        ``actor.microbatch_tokens`` padded tokens, each loss weighted by its share of the minibatch's
        action tokens (of its turns, for the shared critic's per-turn value loss): the accumulated
        gradient, the step and the logged statistics are the whole minibatch's, with less padding.

        ``progress`` (the reporter's ``sub``) counts the minibatch steps of all epochs as they are taken.
        """
        p = self.cfg.ppo
        # Dropout off (gradients still flow): the log-probs must be the policy's, as at sampling time, or
        # the first ratio differs from 1 by dropout noise alone and clipping acts on it (as TRL and verl do).
        # The decoder layers keep train mode, which only gates gradient checkpointing.
        self.actor.train_without_dropout()
        # Decoupled PPO: the proximal policy is the actor as this update starts, read once before any step.
        prox = self._proximal_logprobs(episodes, temperature) if p.decoupled else None
        stats: dict[str, list[float]] = {}
        real = padded = 0
        idx = list(range(len(episodes)))
        stopped = False
        # Pushed-down turns with nothing to imitate still make one minibatch (its unlikelihood term alone).
        alone = negatives is not None or beside is not None
        starts = range(0, max(len(idx), 1 if alone else 0), p.minibatch_episodes)
        advance = progress("update", len(starts) * algo.epochs)
        for _epoch in range(algo.epochs):
            self.py_rng.shuffle(idx)
            kls = []
            for s in starts:
                mb = idx[s : s + p.minibatch_episodes]
                acc = MicroStats()
                parts: Iterable[torch.Tensor] = self._rl_losses(
                    algo, [episodes[i] for i in mb], adv[mb], returns[mb], old_values[mb], acc,
                    temperature=temperature, ent_coef=ent_coef, weight=w_rl,
                    prox=[prox[i] for i in mb] if prox is not None else None)
                if w_bc > 0:  # a minibatch of a term alone (nothing kept) keeps a minibatch's BC anchor
                    parts = itertools.chain(parts, self.bc_term(len(mb) or p.minibatch_episodes, acc, weight=w_bc))
                if negatives is not None:
                    neg_eps, neg_turns = negatives
                    neg = self.py_rng.sample(range(len(neg_eps)), min(p.minibatch_episodes, len(neg_eps)))
                    parts = itertools.chain(parts, self._unlikelihood_losses(
                        [neg_eps[i] for i in neg], neg_turns[neg], acc, temperature=temperature,
                        weight=p.error_unlikelihood))
                if beside is not None:
                    parts = itertools.chain(parts, beside(acc))
                params = self.actor.trainable_parameters() + self.critic.joint_parameters()
                self.begin_step()

                def within_kl(acc: MicroStats = acc) -> bool:
                    # This minibatch's approx_kl, measured before its step: past KL_STOP x target_kl the policy
                    # has left the samples' neighbourhood; the step is not taken and the update ends here.
                    kl = acc.result().get("losses/approx_kl")
                    return p.target_kl is None or kl is None or kl <= KL_STOP * p.target_kl

                ok, norm = self.step(parts, self.opt, params, self.cfg.actor.max_grad_norm,
                                     where=f"rl iter {self.state.iter}", extra_opt=self.critic.joint_optimizer(),
                                     proceed=within_kl)
                out = acc.result()
                real, padded = real + acc.real, padded + acc.padded
                if ok is None:  # declined by the KL limit: not stepped, so its statistics stay out of the means
                    stats["losses/kl_stop"] = [1.0]
                    for k in ("approx_kl", "ratio_mean"):
                        if f"losses/{k}" in out:
                            stats[f"losses/declined_{k}"] = [out[f"losses/{k}"]]
                    stopped = True
                    break
                advance(1)
                for k, v in out.items():
                    stats.setdefault(k, []).append(v)
                stats.setdefault("grad/actor_norm", []).append(norm)
                if "losses/approx_kl" in out:
                    kls.append(out["losses/approx_kl"])
            if stopped:
                break
            if p.target_kl is not None and kls and sum(kls) / len(kls) > p.target_kl:
                stats.setdefault("losses/early_stop_epoch", []).append(float(_epoch))
                break
        return {**{k: sum(v) / len(v) for k, v in stats.items()}, "perf/actor_padding": 1 - real / max(1, padded)}

    def _rl_losses(self, algo: TokenLoss, eps: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
                   old_values: torch.Tensor, acc: MicroStats, *, temperature: float, ent_coef: float, weight: float,
                   prox: Sequence[list[torch.Tensor]] | None = None) -> Iterator[torch.Tensor]:
        """One minibatch's ``weight`` x policy loss (+ the shared critic's loss) as weighted micro-batch losses.

        ``adv``, ``returns``, ``old_values`` are the minibatch's ``[E, T]`` rows; ``prox``, with
        ``ppo.decoupled``, each episode's proximal log-probs per segment (:meth:`_proximal_logprobs`); the
        minibatch's statistics go into ``acc``. A micro-batch's losses are computed only when the previous one's
        backward is done (a generator), so one micro-batch's activations are alive at a time.
        """
        n_act = max(1, sum(action_tokens(ep.segments) for ep in eps))
        n_turns = max(1, sum(len(ep.turns) for ep in eps))
        for micro, sub, batch in self._episode_micro_batches(eps, acc):
            loss = torch.zeros(())
            po = policy_output(self.actor, batch, temperature=temperature)
            critic_loss, critic_stats = self.critic.actor_loss(sub, batch, po.hidden, returns[micro], old_values[micro])
            turn_share = sum(len(ep.turns) for ep in sub) / n_turns
            if critic_loss is not None:
                loss = loss + turn_share * critic_loss
            acc.add(critic_stats, turn_share)
            adv_tok = segment_advantages(adv[micro], batch)
            # A KL penalty (config validation: ppo.algo ppo only) reads the frozen reference's log-probs.
            use_ref = self.cfg.ppo.kl_coef > 0 and self.ref_actor is not None
            ref = self.ref_logprobs(batch, temperature) if use_ref else None
            prox_lp = (_target_grid([row for j in micro for row in prox[j]], batch.old_logprobs)
                       if prox is not None else None)
            out = algo.loss(po, batch, adv_tok, ent_coef=ent_coef, ref_logprobs=ref, prox_logprobs=prox_lp)
            share = sum(action_tokens(ep.segments) for ep in sub) / n_act
            acc.add({f"losses/{k}" if k != "loss" else "losses/actor_loss": v for k, v in out.items()}, share)
            yield loss + weight * share * out["loss"]

    def _unlikelihood_losses(self, eps: Sequence[Episode], turns: torch.Tensor, acc: MicroStats, *,
                             temperature: float, weight: float) -> Iterator[torch.Tensor]:
        """``weight`` x the mean over ``turns`` (``[N, T]`` 0/1) of ``-log(1 - p(action))``
        (:func:`~polyturn.algos.bc.action_unlikelihood`), as micro-batch losses weighted by their share of the
        turns; ``losses/error_unlikelihood`` and ``rft/error_action_prob`` (the pushed actions' mean
        probability) go into ``acc``."""
        n_turns = max(1.0, float(turns.sum()))
        width = turns.shape[1]
        for micro, _, batch in self._episode_micro_batches(eps, acc):
            po = policy_output(self.actor, batch, temperature=temperature)
            on = segment_advantages(turns[micro].float(), batch) > 0  # the pushed turns' action tokens
            action_id = torch.where(on, batch.episode_index[:, None] * width + batch.turn_index, -1)
            out = action_unlikelihood(po.logprobs, action_id)
            share = float(turns[micro].sum()) / n_turns
            acc.add({"losses/error_unlikelihood": out["loss"], "rft/error_action_prob": out["action_prob"]}, share)
            yield weight * share * out["loss"]

    def _episode_micro_batches(self, eps: Sequence[Episode],
                               acc: MicroStats) -> Iterator[tuple[list[int], list[Episode], TokenBatch]]:
        """``eps`` in length-sorted micro-batches of at most ``actor.microbatch_tokens`` padded tokens (this
        process's share under torchrun), each counted in ``acc``: the indices, the episodes and their batch,
        made only when asked for (so one micro-batch is alive at a time)."""
        for micro in distributed.shard(self._micro_batches([ep.segments for ep in eps])):
            sub = [eps[j] for j in micro]
            acc.count([[len(s) for s in ep.segments] for ep in sub])
            yield micro, sub, make_token_batch([(j, seg) for j, ep in enumerate(sub) for seg in ep.segments],
                                               pad_id=self.actor.pad_id, device=self.runtime.device,
                                               share_prefix=self.cfg.actor.shared_prefix)

    def _micro_batches(self, items: Sequence[Sequence[Segment]]) -> list[list[int]]:
        """Items (each its segments) in micro-batches of at most ``actor.microbatch_tokens`` padded tokens; with
        ``actor.shared_prefix`` the prefix all their rows share counts once a micro-batch."""
        prefix = shareable_prefix([seg.ids for segs in items for seg in segs]) if self.cfg.actor.shared_prefix else 0
        return micro_batches([[len(s) for s in segs] for segs in items], self.cfg.actor.microbatch_tokens,
                             prefix=prefix)

    @torch.no_grad()
    def _proximal_logprobs(self, episodes: Sequence[Episode], temperature: float) -> list[list[torch.Tensor]]:
        """Each episode's log-probs of its own tokens under the actor as it is now, per segment (``[len - 1]``,
        on the target grid, on the run's device): decoupled PPO's proximal policy, read before the update's first
        step.

        One forward pass per micro-batch, with dropout off as in the update; every torchrun process reads all
        the episodes (it trains on micro-batches of any of them).
        """
        out: list[list[torch.Tensor]] = [[] for _ in episodes]
        for micro in self._micro_batches([ep.segments for ep in episodes]):
            items = [(j, seg) for j in micro for seg in episodes[j].segments]
            batch = make_token_batch(items, pad_id=self.actor.pad_id, device=self.runtime.device,
                                     share_prefix=self.cfg.actor.shared_prefix)
            lp = policy_output(self.actor, batch, temperature=temperature).logprobs.float()
            for r, (j, seg) in enumerate(items):
                out[j].append(lp[r, : len(seg) - 1].clone())
        return out

    # ---- one RL iteration ---------------------------------------------------------------------
    def learn(self, algo: PolicyUpdateLike, episodes: Sequence[Episode], *, phase: str, gamma: float, temp: float,
              ent_coef: float, beside: bool, timings: dict[str, float],
              progress: SubProgress = ignore_steps) -> tuple[dict[str, Any], Callable[[], dict[str, float]]]:
        """One RL iteration of this policy on its episodes: values -> adv -> update_critic (in line, unless
        ``beside``: then the caller runs it beside the next sampling) -> update_actor (``algo``; none in the
        critic warm-up ``phase``). Returns the metrics and the critic's update; ``timings`` accumulates the stages'
        seconds; ``progress`` (the reporter's ``sub``) counts the actor update's steps."""
        policy, cfg, cur, critic = self, self.cfg, self.cfg.curriculum, self.critic
        metrics: dict[str, Any] = {}
        if cfg.rollout.engine == "vllm":  # vLLM's behaviour log-probs against the actor's own, every iteration
            with torch.no_grad():
                metrics.update(logprob_gap(episodes, self._proximal_logprobs(episodes, temp)))
        t = time.perf_counter()
        tt = turn_tensors(episodes)
        tt["rewards"] = tt["rewards"] * cfg.ppo.reward_scale
        full = make_token_batch([(i, s) for i, ep in enumerate(episodes) for s in ep.segments],
                                pad_id=policy.actor.pad_id, device=self.runtime.device)
        values, next_values = critic.values(episodes, full)
        timings["perf/values_s"] = timings.get("perf/values_s", 0.0) + time.perf_counter() - t

        t = time.perf_counter()
        adv, returns = critic.advantages(episodes, tt, values, next_values, gamma=gamma, lam=cfg.ppo.lam,
                                         reward_scale=cfg.ppo.reward_scale)
        if self.constraints is not None:  # the multipliers' step, the cost critics, A_reward - sum lambda A_cost
            adv, m = self.constraints.learn(episodes, full, adv, gamma=gamma, lam=cfg.ppo.lam, step=phase != "warmup",
                                            combine=not algo.imitates)
            metrics.update(m)
        if cfg.ppo.normalize_advantages:
            # Whiten as the token-level loss sees them: each turn counts once per action token.
            n_tok = torch.zeros_like(adv)
            for i, ep in enumerate(episodes):
                for j, turn in enumerate(ep.turns):
                    n_tok[i, j] = len(turn.action_ids)
            adv = normalize(adv, tt["mask"], weights=n_tok)
        timings["perf/adv_s"] = timings.get("perf/adv_s", 0.0) + time.perf_counter() - t

        # Beside, the update reads its own copies: the actor's update runs first on the same tensors.
        targets = (returns.clone(), values.clone()) if beside else (returns, values)
        update_critic = functools.partial(critic.update, episodes, *targets, gamma=gamma,
                                          reward_scale=cfg.ppo.reward_scale, with_actor=phase != "warmup")
        if not beside:
            metrics.update(timed_update(update_critic))

        t = time.perf_counter()
        if phase != "warmup":
            w_bc, w_rl = (cur.w_bc, cur.w_rl) if phase == "mixed" else (0.0, 1.0)
            metrics.update(algo.update(policy, episodes, adv, returns, values, tt["mask"], temperature=temp,
                                       ent_coef=ent_coef, w_bc=w_bc, w_rl=w_rl, progress=progress))
        timings["perf/update_actor_s"] = timings.get("perf/update_actor_s", 0.0) + time.perf_counter() - t
        if critic.has_values:
            metrics["losses/explained_variance"] = float(explained_variance(values, returns, tt["mask"]))
        return metrics, update_critic

    # ---- the frozen reference --------------------------------------------------------------
    def set_reference(self) -> None:
        """The reference (``ppo.kl_coef > 0``, or turn-DPO's): a frozen copy of the policy RL starts from (BC).

        Made once, when RL starts (after BC, or from ``actor.init_from``); every
        checkpoint keeps it (``ref_actor/``) and resume restores it from there.
        """
        if self.cfg.ppo.frozen_reference and self.ref_actor is None:
            ref = copy.deepcopy(self.actor.model).requires_grad_(False).eval()
            self.ref_actor = dataclasses.replace(self.actor, model=ref)

    def restore_reference(self, directory: Path, *, bc_dir: Path) -> None:
        """On resume: the checkpoint's ``ref_actor/``, else the run's BC checkpoint (``bc_dir``), else
        ``actor.init_from``."""
        if not self.cfg.ppo.frozen_reference or self.state.phase != "rl":
            return  # resumed during BC: the reference is made when BC ends
        init = Path(self.cfg.actor.init_from) if self.cfg.actor.init_from else None
        candidates = [directory / "ref_actor", bc_dir / "actor"]
        if init is not None:
            candidates.append(init / "actor" if (init / "actor").is_dir() else init)
        src = next((c for c in candidates if c.is_dir()), None)
        if src is None:
            p = self.cfg.ppo
            why, fix = ((f"ppo.kl_coef = {p.kl_coef}", "ppo.kl_coef=0") if p.kl_coef > 0 else
                        ("ppo.refusal_pairs", "ppo.refusal_pairs=null") if p.refusal_pairs is not None else
                        ("ppo.algo = turn_dpo with ppo.dpo_reference = bc", "ppo.dpo_reference=behaviour"))
            raise FileNotFoundError(
                f"{why} needs the BC policy as the reference; expected it in {candidates[0]} or {candidates[1]}, "
                f"found neither. Resume with {fix}, or start a new run."
            )
        if src != candidates[0]:
            self.on_message(f"Reference policy: {directory.name} holds none (written without one?); "
                            f"using the BC policy in {src}")
        with torch.random.fork_rng():  # building the model draws random inits: keep the restored RNG streams exact
            ref = load_actor(src).to(self.actor.runtime)
        ref.model.requires_grad_(False).eval()
        self.ref_actor = ref

    @torch.no_grad()
    def ref_logprobs(self, batch: TokenBatch, temperature: float) -> torch.Tensor:
        """The frozen reference's log-probs of ``batch``'s tokens."""
        return policy_output(self.ref_actor, batch, temperature=temperature).logprobs


def logprob_gap(episodes: Sequence[Episode], current: Sequence[list[torch.Tensor]]) -> dict[str, float]:
    """How far the behaviour log-probs an engine reported are from the actor's own (``current``: per episode and
    segment, on the target grid, as :meth:`Policy._proximal_logprobs`) over the action tokens: the largest and the
    mean absolute difference (``rollout/logprob_gap_max``, ``rollout/logprob_gap_mean``). A silent gap biases
    every importance ratio (verl and SkyRL users have hit it); on float32 SmolLM2 vLLM's CPU build stays within
    4e-5 (tests/rollout/test_vllm.py)."""
    diffs = []
    for ep, rows in zip(episodes, current):
        for seg, row in zip(ep.segments, rows):
            mask = torch.tensor(seg.action_mask[1:], dtype=torch.bool)
            behaviour = torch.tensor(seg.logprobs[1:], dtype=torch.float32)
            diffs.append((row.cpu()[mask] - behaviour[mask]).abs())
    d = torch.cat(diffs) if diffs else torch.zeros(1)
    if d.numel() == 0:
        d = torch.zeros(1)
    return {"rollout/logprob_gap_max": float(d.max()), "rollout/logprob_gap_mean": float(d.mean())}


def _target_grid(rows: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Right-pad per-segment rows (``[len - 1]`` each, in the batch's segment order) to ``like``'s ``[S, L-1]``."""
    out = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    for r, row in enumerate(rows):
        out[r, : row.numel()] = row
    return out
