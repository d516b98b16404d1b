"""``ppo.algo: turn_dpo``: turn-level preference updates on candidate turns the action critic ranked (SWEET-RL).

One update:

1. draw ``ppo.dpo_states`` states (episode, turn) from the iteration's episodes;
2. sample ``ppo.dpo_candidates`` candidate turns at each through the rollout
   engine (exact ids and behaviour log-probs, :func:`sample_candidates`);
3. the critic scores every candidate (with the state's privileged text when it reads it);
4. pairs: the i-th best with the i-th of the bottom half, from the same state (ties dropped);
5. ``ppo.epochs`` passes of DPO over the pairs plus ``ppo.dpo_nll`` x the NLL of the preferred turns
   (+ ``w_bc`` x BC in the mixed phase).

The DPO reference (``ppo.dpo_reference``): ``bc`` (default) is a frozen copy of
the policy RL starts from, as in DPO and SWEET-RL, so the implicit rewards
measure how far the actor has moved from it; ``behaviour`` uses the candidates'
sampling log-probs, a reference that moves every iteration. With ``behaviour``
the tiny Negotiation actor drifted to invalid actions in 60 iterations
(docs/action-critic.md).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from polyturn.algos.preference import dpo_loss
from polyturn.config import TrainConfig
from polyturn.rollout.candidates import action_text, sample_candidates, turn_context
from polyturn.rollout.types import Episode
from polyturn.train.algorithms import PolicyUpdate
from polyturn.train.batch import MicroStats, make_token_batch, policy_output
from polyturn.train.critics import state_input
from polyturn.train.pairs import CandidatePair
from polyturn.train.policy import Policy
from polyturn.train.reporting import ignore_steps


def dpo_pairs(scores: Sequence[float]) -> list[tuple[int, int]]:
    """``(preferred, rejected)`` candidate indices: rank i of the top half with rank i of the bottom half.

    With an odd count the middle candidate sits out; a pair whose two scores tie is dropped.
    """
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    half = len(scores) // 2
    top, bottom = order[:half], order[len(scores) - half :]
    return [(a, b) for a, b in zip(top, bottom) if scores[a] > scores[b]]


def collect_pairs(policy: Policy, episodes: Sequence[Episode], *, temperature: float) -> tuple[list[CandidatePair],
                                                                                              dict[str, float]]:
    """Steps 1-4 of the module docstring; returns the pairs and their metrics."""
    p = policy.cfg.ppo
    states = [(i, t) for i, ep in enumerate(episodes) for t in range(len(ep.turns))]
    states = policy.py_rng.sample(states, min(p.dpo_states, len(states)))
    contexts = [turn_context(episodes[i], t) for i, t in states]
    policy.actor.model.eval()
    cands = sample_candidates(policy.actor, contexts, k=p.dpo_candidates, temperature=temperature,
                              top_p=policy.settings.top_p, max_new_tokens=policy.settings.max_action_tokens,
                              generator=policy.gen)
    inputs = []
    for (i, t), acts in zip(states, cands):
        ep = episodes[i]
        inputs += [dataclasses.replace(state_input(ep, t), action=action_text(policy.actor, a)) for a in acts]
    scores = policy.critic.score_candidates(inputs).tolist()
    pairs, gaps, k = [], [], 0
    for ctx, acts in zip(contexts, cands):
        s = scores[k : k + len(acts)]
        k += len(acts)
        for a, b in dpo_pairs(s):
            pairs.append(CandidatePair(ctx, acts[a], acts[b]))
            gaps.append(s[a] - s[b])
    return pairs, {"dpo/pairs": float(len(pairs)), "dpo/score_gap": sum(gaps) / max(1, len(gaps))}


class TurnDPO(PolicyUpdate):
    """``ppo.algo: turn_dpo`` (see the module docstring)."""

    @classmethod
    def check(cls, cfg: TrainConfig, *, world_size: int = 1) -> None:
        if world_size > 1:
            raise ValueError(f"Expected one process per run with ppo.algo = turn_dpo (its update is not sharded "
                             f"yet), got --nproc {world_size}: use another ppo.algo with --nproc, or train in one "
                             "process")

    def set_reference(self, policy: Policy, pairs: Sequence[CandidatePair], *, temperature: float) -> None:
        """Each pair's reference log-probs, once per update (the reference never changes within it): the frozen
        BC policy's (``dpo_reference: bc``), in no-grad batches of ``minibatch_episodes`` pairs, or the
        candidates' own sampling log-probs (``behaviour``)."""
        if self.cfg.dpo_reference == "behaviour":
            for pr in pairs:
                pr.ref = (sum(pr.chosen.logprobs), sum(pr.rejected.logprobs))
            return
        for s in range(0, len(pairs), self.cfg.minibatch_episodes):
            mb = pairs[s : s + self.cfg.minibatch_episodes]
            segs = [pr.segment(pr.chosen) for pr in mb] + [pr.segment(pr.rejected) for pr in mb]
            batch = make_token_batch(list(enumerate(segs)), pad_id=policy.actor.pad_id,
                                     device=policy.runtime.device)
            ref = (policy.ref_logprobs(batch, temperature) * batch.action_mask).sum(1).tolist()
            for k, pr in enumerate(mb):
                pr.ref = (ref[k], ref[len(mb) + k])

    def _losses(self, policy: Policy, pairs: Sequence[CandidatePair], acc: MicroStats, *, temperature: float,
                weight: float) -> Iterator[torch.Tensor]:
        """The minibatch's ``weight`` x (DPO + dpo_nll x NLL of the preferred turns), as one loss."""
        p = self.cfg
        segs = [pr.segment(pr.chosen) for pr in pairs] + [pr.segment(pr.rejected) for pr in pairs]
        acc.count([[len(s)] for s in segs])
        batch = make_token_batch(list(enumerate(segs)), pad_id=policy.actor.pad_id, device=policy.runtime.device)
        po = policy_output(policy.actor, batch, temperature=temperature)
        lp = (po.logprobs * batch.action_mask).sum(1)
        ref = torch.tensor([pr.ref for pr in pairs], dtype=lp.dtype, device=lp.device)  # [n, 2]
        n = len(pairs)
        out = dpo_loss(lp[:n], lp[n:], ref[:, 0], ref[:, 1], beta=p.dpo_beta)
        m = batch.action_mask[:n]
        nll = -(po.logprobs[:n] * m).sum() / m.sum().clamp_min(1.0)
        acc.add({"losses/dpo_loss": out["loss"], "losses/dpo_nll": nll, "dpo/reward_margin": out["reward_margin"],
                 "dpo/accuracy": out["accuracy"]}, 1.0)
        yield weight * (out["loss"] + p.dpo_nll * nll)

    def update(self, policy: Policy, episodes: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
               values: torch.Tensor, mask: torch.Tensor, **kw: Any) -> dict[str, float]:
        temperature, w_bc, w_rl = kw["temperature"], kw["w_bc"], kw["w_rl"]
        pairs, metrics = collect_pairs(policy, episodes, temperature=temperature)
        if not pairs:
            return metrics
        self.set_reference(policy, pairs, temperature=temperature)
        policy.actor.train_without_dropout()
        stats: dict[str, list[float]] = {}
        idx = list(range(len(pairs)))
        starts = range(0, len(idx), self.cfg.minibatch_episodes)
        advance = kw.get("progress", ignore_steps)("update", len(starts) * self.epochs)
        for _ in range(self.epochs):
            policy.py_rng.shuffle(idx)
            for s in starts:
                mb = [pairs[i] for i in idx[s : s + self.cfg.minibatch_episodes]]
                acc = MicroStats()
                parts: Iterable[torch.Tensor] = self._losses(policy, mb, acc, temperature=temperature, weight=w_rl)
                if w_bc > 0:
                    parts = itertools.chain(parts, policy.bc_term(len(mb), acc, weight=w_bc))
                policy.begin_step()
                _, norm = policy.step(parts, policy.opt, policy.actor.trainable_parameters(),
                                      policy.cfg.actor.max_grad_norm, where=f"rl iter {policy.state.iter}")
                advance(1)
                for k, v in {**acc.result(), "grad/actor_norm": norm}.items():
                    stats.setdefault(k, []).append(v)
        return {**metrics, **{k: sum(v) / len(v) for k, v in stats.items()}}
