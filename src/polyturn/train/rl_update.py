"""The RL actor step of the trainer (a :class:`Trainer` mixin): the minibatch loop shared by the policy-gradient
updates of :mod:`polyturn.train.algorithms`, and the frozen KL reference policy."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from polyturn.algos.bc import action_unlikelihood
from polyturn.models.actor import load_actor
from polyturn.rollout.types import Episode
from polyturn.train import distributed
from polyturn.train.batch import (
    MicroStats,
    TokenBatch,
    action_tokens,
    make_token_batch,
    micro_batches,
    policy_output,
    segment_advantages,
)

#: A PPO minibatch whose approx_kl (measured before its step) passes this multiple of ppo.target_kl is not
#: stepped, and the update ends there (SB3 stops at 1.5x; the epoch-mean limit of ppo.target_kl also applies).
KL_STOP = 2.0


class RLUpdates:
    """The actor's policy-gradient step over minibatches of episodes, and the KL reference."""

    def update_actor(self, episodes: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
                     old_values: torch.Tensor, *, temperature: float, ent_coef: float, w_bc: float,
                     w_rl: float, negatives: tuple[Sequence[Episode], torch.Tensor] | None = None) -> dict[str, float]:
        """Token-level PPO-clip (or A2C) over minibatches of episodes, early-stopped on approx_kl.

        ``negatives`` (rft's ``ppo.error_unlikelihood``): episodes and their ``[N, T]`` 0/1 turns to push down;
        beside each minibatch, ``minibatch_episodes`` of them drawn at random add the unlikelihood term (a
        minibatch of it alone when ``episodes`` is empty).

        A minibatch's forward and backward run in length-sorted micro-batches of at most
        ``actor.microbatch_tokens`` padded tokens, each loss weighted by its share of the minibatch's
        action tokens (of its turns, for the shared critic's per-turn value loss): the accumulated
        gradient, the step and the logged statistics are the whole minibatch's, with less padding.
        """
        p = self.cfg.ppo
        # Dropout off (gradients still flow): the log-probs must be the policy's, as at sampling time, or
        # the first ratio differs from 1 by dropout noise alone and clipping acts on it (as TRL and verl do).
        # The decoder layers keep train mode, which only gates gradient checkpointing.
        self.actor.train_without_dropout()
        epochs = self.algo.epochs
        # Decoupled PPO: the proximal policy is the actor as this update starts, read once before any step.
        prox = self._proximal_logprobs(episodes, temperature) if p.decoupled else None
        stats: dict[str, list[float]] = {}
        real = padded = 0
        idx = list(range(len(episodes)))
        stopped = False
        for _epoch in range(epochs):
            self.py_rng.shuffle(idx)
            kls = []
            # Pushed-down turns with nothing to imitate still make one minibatch (its unlikelihood term alone).
            for s in range(0, max(len(idx), 1 if negatives is not None else 0), p.minibatch_episodes):
                mb = idx[s : s + p.minibatch_episodes]
                acc = MicroStats()
                parts: Iterable[torch.Tensor] = self._rl_losses(
                    [episodes[i] for i in mb], adv[mb], returns[mb], old_values[mb], acc,
                    temperature=temperature, ent_coef=ent_coef, weight=w_rl,
                    prox=[prox[i] for i in mb] if prox is not None else None)
                if w_bc > 0:
                    demo_idx = self.py_rng.sample(range(len(self._demo_items)), min(len(mb), len(self._demo_items)))
                    parts = itertools.chain(parts, self._bc_batch_loss(demo_idx, acc, weight=w_bc))
                if negatives is not None:
                    neg_eps, neg_turns = negatives
                    neg = self.py_rng.sample(range(len(neg_eps)), min(p.minibatch_episodes, len(neg_eps)))
                    parts = itertools.chain(parts, self._unlikelihood_losses(
                        [neg_eps[i] for i in neg], neg_turns[neg], acc, temperature=temperature,
                        weight=p.error_unlikelihood))
                params = self.actor.trainable_parameters() + self.critic.joint_parameters()
                for g in self.actor_opt.param_groups:
                    g["lr"] = self.cfg.actor.lr * self._actor_lr_factor()
                self.state["actor_steps"] = self.state.get("actor_steps", 0) + 1

                def within_kl(acc: MicroStats = acc) -> bool:
                    # This minibatch's approx_kl, measured before its step: past KL_STOP x target_kl the policy
                    # has left the samples' neighbourhood; the step is not taken and the update ends here.
                    kl = acc.result().get("losses/approx_kl")
                    return p.target_kl is None or kl is None or kl <= KL_STOP * p.target_kl

                ok, norm = self._guarded_step(parts, self.actor_opt, params, self.cfg.actor.max_grad_norm,
                                              where=f"rl iter {self.state['iter']}",
                                              extra_opt=self.critic.joint_optimizer(), proceed=within_kl)
                out = acc.result()
                real, padded = real + acc.real, padded + acc.padded
                if ok is None:  # declined by the KL limit: not stepped, so its statistics stay out of the means
                    stats["losses/kl_stop"] = [1.0]
                    for k in ("approx_kl", "ratio_mean"):
                        if f"losses/{k}" in out:
                            stats[f"losses/declined_{k}"] = [out[f"losses/{k}"]]
                    stopped = True
                    break
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

    def _rl_losses(self, eps: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
                   acc: MicroStats, *, temperature: float, ent_coef: float, weight: float,
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
            ref = self._ref_logprobs(batch, temperature) if use_ref else None
            prox_lp = (_target_grid([row for j in micro for row in prox[j]], batch.old_logprobs)
                       if prox is not None else None)
            out = self.algo.loss(po, batch, adv_tok, ent_coef=ent_coef, ref_logprobs=ref, prox_logprobs=prox_lp)
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
        for micro in distributed.shard(micro_batches([[len(s) for s in ep.segments] for ep in eps],
                                                     self.cfg.actor.microbatch_tokens)):
            sub = [eps[j] for j in micro]
            acc.count([[len(s) for s in ep.segments] for ep in sub])
            yield micro, sub, make_token_batch([(j, seg) for j, ep in enumerate(sub) for seg in ep.segments],
                                               pad_id=self.actor.pad_id, device=self.runtime.device)

    @torch.no_grad()
    def _proximal_logprobs(self, episodes: Sequence[Episode], temperature: float) -> list[list[torch.Tensor]]:
        """Each episode's log-probs of its own tokens under the actor as it is now, per segment (``[len - 1]``,
        on the target grid, on the run's device): decoupled PPO's proximal policy, read before the update's first
        step.

        One forward pass per micro-batch, with dropout off as in the update; every torchrun process reads all
        the episodes (it trains on micro-batches of any of them).
        """
        out: list[list[torch.Tensor]] = [[] for _ in episodes]
        for micro in micro_batches([[len(s) for s in ep.segments] for ep in episodes],
                                   self.cfg.actor.microbatch_tokens):
            items = [(j, seg) for j in micro for seg in episodes[j].segments]
            batch = make_token_batch(items, pad_id=self.actor.pad_id, device=self.runtime.device)
            lp = policy_output(self.actor, batch, temperature=temperature).logprobs.float()
            for r, (j, seg) in enumerate(items):
                out[j].append(lp[r, : len(seg) - 1].clone())
        return out

    def _set_reference(self) -> None:
        """The reference (``ppo.kl_coef > 0``, or turn-DPO's): a frozen copy of the policy RL starts from (BC).

        Made once, when RL starts (after BC, or from ``actor.init_from``); every
        checkpoint keeps it (``ref_actor/``) and resume restores it from there.
        """
        if self.cfg.ppo.frozen_reference and self.ref_actor is None:
            ref = copy.deepcopy(self.actor.model).requires_grad_(False).eval()
            self.ref_actor = dataclasses.replace(self.actor, model=ref)

    def _restore_reference(self, directory: Path) -> None:
        """On resume: the checkpoint's ``ref_actor/``, else the run's BC checkpoint, else ``actor.init_from``."""
        if not self.cfg.ppo.frozen_reference or self.state["phase"] != "rl":
            return  # resumed during BC: the reference is made when BC ends
        init = Path(self.cfg.actor.init_from) if self.cfg.actor.init_from else None
        candidates = [directory / "ref_actor", Path(self.cfg.run.out_dir) / "ckpt-bc" / "actor"]
        if init is not None:
            candidates.append(init / "actor" if (init / "actor").is_dir() else init)
        src = next((c for c in candidates if c.is_dir()), None)
        if src is None:
            p = self.cfg.ppo
            why = f"ppo.kl_coef = {p.kl_coef}" if p.kl_coef > 0 else "ppo.algo = turn_dpo with ppo.dpo_reference = bc"
            fix = "ppo.kl_coef=0" if p.kl_coef > 0 else "ppo.dpo_reference=behaviour"
            raise FileNotFoundError(
                f"{why} needs the BC policy as the reference; expected it in {candidates[0]} or {candidates[1]}, "
                f"found neither. Resume with {fix}, or start a new run."
            )
        if src != candidates[0]:
            self.rep.message(f"Reference policy: {directory.name} holds none (written without one?); "
                             f"using the BC policy in {src}")
        with torch.random.fork_rng():  # building the model draws random inits: keep the restored RNG streams exact
            ref = load_actor(src).to(self.actor.runtime)
        ref.model.requires_grad_(False).eval()
        self.ref_actor = ref

    @torch.no_grad()
    def _ref_logprobs(self, batch: TokenBatch, temperature: float) -> torch.Tensor:
        return policy_output(self.ref_actor, batch, temperature=temperature).logprobs


def _target_grid(rows: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Right-pad per-segment rows (``[len - 1]`` each, in the batch's segment order) to ``like``'s ``[S, L-1]``."""
    out = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    for r, row in enumerate(rows):
        out[r, : row.numel()] = row
    return out
