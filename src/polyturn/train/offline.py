"""The offline phase: RL from recorded episodes (config ``offline``, docs/offline.md), read top to bottom.

    data      read every file of offline.data with the one JSONL reader; refuse another env's records
    summary   the dataset's return distribution and per-policy-version counts, reported first
    tokens    each record's segments: its recorded action ids when they are this actor's, else tokenized as BC does
    split     offline.held_out of the tasks never train the critic: its held-out explained variance
    rounds    offline.rounds times:
      critic    awr, value_pretrain, none: V on the lambda-returns of the data            (value_loss)
                iql: V by expectile regression on Q_target, Q on r + gamma V(s')          (iql_losses)
                cql: Q on r + gamma V_target(s') + alpha x penalty over the data action and K actions the
                     actor samples at s; V on their mean Q                                 (cql_losses)
      actor     the recorded action tokens' NLL, each turn weighted: filtered_bc 1 on the chosen episodes;
                awr, iql, cql min(exp(A / T), max_weight) with A = R^lambda - V, Q_target - V, Q - V
    handover  the actor and the critic go on into the RL phases (the trainer's loop, as after BC)

Hyper-parameters: :class:`polyturn.config.OfflineConfig` (``offline.*``); the critic's sizes, ``lr``, ``minibatch``,
``tau`` and ``max_grad_norm`` are ``critic.*``; rewards are scaled by ``ppo.reward_scale`` as the RL phases scale them.
The losses are the pure functions of :mod:`polyturn.algos.offline`.

Simplifications:

* credit is per turn: one ``V(s_t)`` and ``Q(s_t, a_t)`` per turn, the state as the critic reads it (text), every
  token of a turn sharing its weight;
* a round trains the critic, then the actor. IQL's critic never reads the actor, so that is exact for it; CQL
  samples its candidate actions from the actor as the round starts, and AWR's V is the data's (the behaviour
  policy's) value;
* the critic trains on the training split, the actor on every record;
* a critic minibatch (``critic.minibatch`` turns; CQL: K + 1 rows each) is one loss and one backward pass, its
  forward in length-sorted micro-batches of ``critic.microbatch_tokens`` padded tokens;
* the first state's features are not recorded (they read as none), and recorded behaviour log-probs are kept in
  the segments but not read: no importance weights;
* the phase is checkpointed at its end only: a run killed in it restarts it on resume, as BC does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch

from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.algos.gae import normalize, turn_gae
from polyturn.algos.offline import awr_weights, cql_losses, iql_losses, return_filter, weighted_nll
from polyturn.algos.value import ev_ill_conditioned, explained_variance, polyak_update, td_targets, value_loss
from polyturn.algos.masked import masked_mean
from polyturn.config import TrainConfig
from polyturn.models.critic import SeparateCritic, make_target
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.candidates import action_text, sample_candidates, turn_context
from polyturn.rollout.types import Episode
from polyturn.train.batch import (MicroStats, action_tokens, length_batches, make_token_batch, micro_batches,
                                  policy_output, segment_advantages)
from polyturn.train.critics import SeparateLearner, bootstraps, encoded_rows, state_input, turn_tensors
from polyturn.train.logger import RunLogger
from polyturn.train.offline_data import (OfflineData, data_summary, held_out_split, read_offline_data, record_episode,
                                         record_tokens, summary_lines, summary_metrics)
from polyturn.train.policy import Policy
from polyturn.train.reporting import Reporter

#: Contexts per batch of CQL's candidate sampling (each decoded ``offline.cql_candidates`` times).
SAMPLE_CONTEXTS = 32
#: Log every this many steps (and each part's last).
LOG_EVERY = 10


def check_offline(cfg: TrainConfig, *, world_size: int = 1) -> None:
    """Refuse what the offline phase cannot run (the config's own validation checked the rest at load)."""
    if cfg.offline is not None and world_size > 1:
        raise ValueError(f"Expected one process for a run with an offline section, got --nproc {world_size}: the "
                         "offline phase trains in one process; drop --nproc (or the offline section)")


class OfflineHost(Protocol):
    """What the offline phase reads of the trainer that runs it."""

    cfg: TrainConfig
    policy: Policy
    logger: RunLogger
    rep: Reporter
    system: str | None

    @property
    def multi(self) -> bool: ...


@dataclasses.dataclass
class Transitions:
    """The critic's view of turns ``(s_t, a_t, r_t, s_{t+1})``: ``where[i]`` is turn i's (episode, turn)."""

    where: list[tuple[int, int]]
    inputs: list[CriticInput]  # s_t with the recorded a_t
    next_inputs: list[CriticInput]  # s_{t+1} (the final state after an episode's last turn)
    rewards: torch.Tensor  # [N], scaled by ppo.reward_scale
    done: torch.Tensor  # [N] bool: nothing follows (terminated, or the env's own end: critics.bootstraps)


def transitions(episodes: Sequence[Episode], idx: Sequence[int], *, reward_scale: float) -> Transitions:
    """Every turn of episodes ``idx``, in order."""
    where = [(i, t) for i in idx for t in range(len(episodes[i].turns))]
    last = {i: len(episodes[i].turns) - 1 for i in idx}
    return Transitions(
        where=where,
        inputs=[state_input(episodes[i], t) for i, t in where],
        next_inputs=[state_input(episodes[i], t + 1) for i, t in where],
        rewards=torch.tensor([episodes[i].turns[t].reward * reward_scale for i, t in where]),
        done=torch.tensor([t == last[i] and not bootstraps(episodes[i]) for i, t in where]),
    )


class OfflinePhase:
    """The offline phase of a run (see the module docstring): :meth:`load` reads and reports the data at the
    trainer's start, :meth:`run` trains the host's policy and critic on it."""

    def __init__(self, cfg: TrainConfig, data: OfflineData) -> None:
        if cfg.offline is None:
            raise ValueError("Expected a config with an offline section, got offline = null")
        self.cfg, self.o, self.data = cfg, cfg.offline, data
        self.summary = data_summary(data)
        self.gamma = self.o.gamma if self.o.gamma is not None else cfg.curriculum.gamma.start
        self.step = 0
        self.target: SeparateCritic | None = None  # iql's and cql's Polyak-averaged critic

    @classmethod
    def load(cls, cfg: TrainConfig, *, rep: Reporter) -> OfflinePhase:
        """Read ``offline.data`` (errors name the field and the fix) and report its summary, before anything else."""
        o = cfg.offline
        phase = cls(cfg, read_offline_data(o.data, env_id=cfg.env.id, judge_range=o.judge_range if o.judge else None))
        for line in summary_lines(phase.summary, cfg.env.id):
            rep.message(line)
        return phase

    # ---- the phase ------------------------------------------------------------------------------
    def run(self, host: OfflineHost, *, first_step: int) -> int:
        """Train ``host.policy`` (actor and critic) on the data; returns the step the next phase logs from."""
        if host.multi:
            raise ValueError("offline.data trains one single-agent policy, got a multi-role env.id "
                             f"({self.cfg.env.id} with env.kwargs {self.cfg.env.kwargs}); drop the offline section")
        o, policy, self.host = self.o, host.policy, host
        self.step = first_step
        _drop_records_from(host.logger, first_step)  # a restarted phase logs its steps again
        host.logger.log(self.step, {"phase": "offline_data", **summary_metrics(self.summary)})
        self.episodes = self._episodes(policy, host.system)
        train, held = held_out_split(self.data.records, o.held_out, seed=self.cfg.run.seed)
        self.train_idx, self.held_idx = train, held
        if o.trains_critic and not held:
            host.rep.message(f"offline: no task held out (offline.held_out = {o.held_out}, "
                             f"{len(self.data.records)} records): no held-out explained variance")
        actor_opt = torch.optim.AdamW(policy.actor.trainable_parameters(), lr=o.lr)
        for r in range(o.rounds):
            if o.trains_critic:
                self._train_critic(policy, round_=r)
            if o.algo != "none":
                self._train_actor(policy, actor_opt, round_=r)
        critic = policy.critic
        if isinstance(critic, SeparateLearner) and critic.target is not None:  # critic.target td: start it here
            critic.target = make_target(critic.critic)
        policy.actor.model.eval()
        return self.step + 1

    def _episodes(self, policy: Policy, system: str | None) -> list[Episode]:
        """The records as episodes on their token segments; reports how many kept their recorded ids."""
        eps, exact, cut, n_actions = [], 0, 0, 0
        for rec in self.data.records:
            tokens, kept = record_tokens(policy.actor, policy.settings, rec, system=system)
            eps.append(record_episode(rec, tokens.segments))
            exact, cut, n_actions = exact + kept, cut + tokens.n_cut, n_actions + tokens.n_actions
        self.host.rep.message(f"offline data: {exact} of {len(eps)} episodes keep their recorded action ids, "
                              f"{len(eps) - exact} tokenized from their text as BC tokenizes demonstrations"
                              + (f"; {cut} of {n_actions} actions cut at rollout.max_action_tokens" if cut else ""))
        return eps

    def _log(self, phase: str, m: dict[str, float], *, force: bool = False, at: int = 0) -> None:
        if force or at % LOG_EVERY == 0:
            self.host.logger.log(self.step, {"phase": phase, **m})
            self.host.rep.metrics(phase, self.step, m)

    # ---- the critic --------------------------------------------------------------------------------
    def _train_critic(self, policy: Policy, *, round_: int) -> None:
        o, learner = self.o, policy.critic
        assert isinstance(learner, SeparateLearner)  # config validation: offline trains the separate critic
        tr = transitions(self.episodes, self.train_idx, reward_scale=self.cfg.ppo.reward_scale)
        if o.algo in ("iql", "cql") and self.target is None:
            self.target = make_target(learner.critic)
        candidates = self._candidates(policy, tr) if o.algo == "cql" else None
        mb_size = learner.cfg.minibatch
        per_epoch = math.ceil(len(tr.where) / mb_size)
        torch.set_num_threads(self.cfg.run.train_threads)
        self.host.rep.start(f"offline critic ({o.algo}, round {round_ + 1})", o.critic_epochs * per_epoch)
        for epoch in range(o.critic_epochs):
            targets = self._returns(learner, self.train_idx, tr) if o.algo in ("awr", "none", "filtered_bc") else None
            order = list(range(len(tr.where)))
            policy.py_rng.shuffle(order)
            learner.critic.train()
            for k, s in enumerate(range(0, len(order), mb_size)):
                mb = order[s : s + mb_size]
                if targets is not None:
                    out = self._value_losses(learner, tr, mb, targets)
                elif candidates is not None:
                    out = self._cql_losses(learner, tr, mb, candidates)
                else:
                    out = self._iql_losses(learner, tr, mb)
                norm = _critic_step(learner, out.pop("loss"))
                if self.target is not None:
                    polyak_update(self.target, learner.critic, learner.cfg.tau)
                self.step += 1
                self.host.rep.advance(1)
                m = {f"offline/{k2}": float(v.detach()) for k2, v in out.items()}
                self._log("offline_critic", {**m, "grad/critic_norm": norm, "offline/critic_epoch": float(epoch)},
                          at=k, force=k == per_epoch - 1 and epoch == o.critic_epochs - 1)
            self._log("offline_critic", self._explained_variance(learner, tr, epoch), force=True)

    def _returns(self, learner: SeparateLearner, idx: Sequence[int], tr: Transitions) -> torch.Tensor:
        """``[N]`` lambda-returns of ``tr``'s turns (episodes ``idx``) with the critic's current values."""
        eps = [self.episodes[i] for i in idx]
        tt = turn_tensors(eps)
        values, next_values = learner.values(eps)
        _, returns = turn_gae(tt["rewards"] * self.cfg.ppo.reward_scale, values, next_values, tt["terminated"],
                              tt["mask"], gamma=self.gamma, lam=self.o.lam)
        pos = {i: j for j, i in enumerate(idx)}
        return torch.tensor([float(returns[pos[i], t]) for i, t in tr.where])

    def _forward(self, learner: SeparateLearner, inputs: Sequence[CriticInput],
                 critic: SeparateCritic | None = None) -> dict[str, torch.Tensor]:
        with learner.runtime.autocast():
            return micro_forward(critic if critic is not None else learner.critic, inputs,
                                 learner.cfg.microbatch_tokens)

    @torch.no_grad()
    def _next_values(self, learner: SeparateLearner, tr: Transitions, mb: Sequence[int],
                     critic: SeparateCritic) -> torch.Tensor:
        """``V(s_{t+1})`` of ``mb``'s turns by ``critic`` (0 where done: never read)."""
        out = torch.zeros(len(mb), device=learner.runtime.device)
        live = [j for j, i in enumerate(mb) if not tr.done[i]]
        if live:
            out[live] = self._forward(learner, [tr.next_inputs[mb[j]] for j in live], critic)["value"]
        return out

    def _value_losses(self, learner: SeparateLearner, tr: Transitions, mb: Sequence[int],
                      targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """V (and Q, when the critic has it) regressed on the lambda-returns (awr, value_pretrain)."""
        out = self._forward(learner, [tr.inputs[i] for i in mb])
        y = targets[mb].to(out["value"].device)
        ones = torch.ones_like(y)
        vl = value_loss(out["value"], y, ones)["loss"]
        res = {"loss": vl, "value_loss": vl}
        if "q" in out:
            res["q_loss"] = value_loss(out["q"], y, ones)["loss"]
            res["loss"] = vl + res["q_loss"]
        return res

    def _iql_losses(self, learner: SeparateLearner, tr: Transitions, mb: Sequence[int]) -> dict[str, torch.Tensor]:
        out = self._forward(learner, [tr.inputs[i] for i in mb])
        with torch.no_grad():
            q_target = self._forward(learner, [tr.inputs[i] for i in mb], self.target)["q"]
        dev = out["value"].device
        return iql_losses(out["value"], out["q"], q_target, self._next_values(learner, tr, mb, learner.critic),
                          tr.rewards[mb].to(dev), tr.done[mb].to(dev), torch.ones(len(mb), device=dev),
                          gamma=self.gamma, expectile=self.o.expectile)

    def _cql_losses(self, learner: SeparateLearner, tr: Transitions, mb: Sequence[int],
                    candidates: list[list[str]]) -> dict[str, torch.Tensor]:
        k = self.o.cql_candidates
        rows = [tr.inputs[i] for i in mb]
        sampled_mask = torch.zeros(len(mb), k, dtype=torch.bool)
        for j, i in enumerate(mb):  # K rows per state: its candidates, padded with the data action (masked out)
            cands = candidates[i]
            sampled_mask[j, : len(cands)] = True
            rows += [dataclasses.replace(tr.inputs[i], action=c) for c in cands + [tr.inputs[i].action] * (k - len(cands))]
        out = self._forward(learner, rows)
        dev, b = out["q"].device, len(mb)
        y = td_targets(tr.rewards[mb].to(dev), self._next_values(learner, tr, mb, self.target), tr.done[mb].to(dev),
                       gamma=self.gamma)
        return cql_losses(out["q"][:b], out["q"][b:].view(b, k), out["value"][:b], y, torch.ones(b, device=dev),
                          alpha=self.o.cql_alpha, sampled_mask=sampled_mask.to(dev))

    @torch.no_grad()
    def _candidates(self, policy: Policy, tr: Transitions) -> list[list[str]]:
        """``offline.cql_candidates`` actions the actor samples at each turn's state (its exact context), as text."""
        actor, s = policy.actor, policy.settings
        torch.set_num_threads(self.cfg.run.rollout_threads)
        actor.model.eval()
        contexts = [turn_context(self.episodes[i], t) for i, t in tr.where]
        self.host.rep.start("offline: CQL candidates", len(contexts))
        out: list[list[str]] = []
        for c in range(0, len(contexts), SAMPLE_CONTEXTS):
            chunk = contexts[c : c + SAMPLE_CONTEXTS]
            acts = sample_candidates(actor, chunk, k=self.o.cql_candidates, temperature=self.o.cql_temperature,
                                     top_p=s.top_p, max_new_tokens=s.max_action_tokens, generator=policy.gen)
            out += [[action_text(actor, a) for a in row] for row in acts]
            self.host.rep.advance(len(chunk))
        return out

    def _explained_variance(self, learner: SeparateLearner, tr: Transitions, epoch: int) -> dict[str, float]:
        """V against the lambda-returns on the training split and on the held-out tasks (``ev_ill_conditioned``:
        reported as NaN, with a message saying why)."""
        m = {"offline/critic_epoch": float(epoch)}
        for name, idx in (("value_explained_variance_train", self.train_idx),
                          ("value_explained_variance", self.held_idx)):
            if not idx:
                continue
            eps = [self.episodes[i] for i in idx]
            tt = turn_tensors(eps)
            values, next_values = learner.values(eps)
            _, returns = turn_gae(tt["rewards"] * self.cfg.ppo.reward_scale, values, next_values, tt["terminated"],
                                  tt["mask"], gamma=self.gamma, lam=self.o.lam)
            m[f"offline/{name}"] = ev = float(explained_variance(values, returns, tt["mask"]))
            if name == "value_explained_variance" and epoch == self.o.critic_epochs - 1:
                mean = float(masked_mean(returns, tt["mask"]))
                var = float(masked_mean((returns - mean) ** 2, tt["mask"]))
                why = (f"ill-conditioned: the held-out returns are nearly constant (variance {var:.3g}, mean "
                       f"{mean:.3g}), so it measures no critic" if ev_ill_conditioned(var, mean) else f"{ev:.3f}")
                self.host.rep.message(f"offline: the critic's held-out explained variance ({len(idx)} episodes): {why}")
        return m

    # ---- the actor --------------------------------------------------------------------------------
    def _turn_weights(self, policy: Policy) -> tuple[list[int], torch.Tensor, dict[str, float]]:
        """The episodes the actor imitates, their ``[E, T]`` turn weights, and metrics."""
        o, eps = self.o, self.episodes
        tt = turn_tensors(eps)
        mask = tt["mask"]
        if o.algo == "filtered_bc":
            keep = return_filter(torch.tensor([ep.episode_return for ep in eps], dtype=torch.float32),
                                 top_fraction=o.top_fraction, min_return=o.min_return)
            chosen = [i for i in range(len(eps)) if keep[i]]
            return chosen, mask, {"offline/kept_episodes": float(len(chosen))}
        learner = policy.critic
        assert isinstance(learner, SeparateLearner)
        if o.algo == "awr":
            values, next_values = learner.values(eps)
            adv, _ = turn_gae(tt["rewards"] * self.cfg.ppo.reward_scale, values, next_values, tt["terminated"], mask,
                              gamma=self.gamma, lam=o.lam)
        else:  # iql: Q_target(s, a) - V(s); cql: Q(s, a) - V(s)
            where = [(i, t) for i in range(len(eps)) for t in range(len(eps[i].turns))]
            inputs = [state_input(eps[i], t) for i, t in where]
            learner.critic.eval()
            with torch.no_grad():
                v = torch.cat([self._forward(learner, inputs[s : s + 128])["value"].cpu()
                               for s in range(0, len(inputs), 128)])
                q_net = self.target if o.algo == "iql" else learner.critic
                q = torch.cat([self._forward(learner, inputs[s : s + 128], q_net)["q"].cpu()
                               for s in range(0, len(inputs), 128)])
            adv = torch.zeros_like(mask)
            for k, (i, t) in enumerate(where):
                adv[i, t] = q[k] - v[k]
        raw = masked_mean(adv, mask)
        if o.normalize_advantages:
            adv = normalize(adv, mask)
        w = awr_weights(adv, mask, temperature=o.temperature, max_weight=o.max_weight)
        n = mask.sum().clamp_min(1)
        return list(range(len(eps))), w, {"offline/adv_mean": float(raw), "offline/weight_mean": float(w.sum() / n),
                                          "offline/weight_max": float(w.max()),
                                          "offline/weight_capped": float(((w >= o.max_weight) & (mask > 0)).sum() / n)}

    def _train_actor(self, policy: Policy, opt: torch.optim.Optimizer, *, round_: int) -> None:
        o, cfg = self.o, self.cfg
        chosen, weights, wm = self._turn_weights(policy)
        if not chosen:
            self.host.rep.message("offline: no episode passes offline.top_fraction / offline.min_return; the actor "
                                  "is not trained")
            return
        steps = max(1, math.ceil(o.epochs * len(chosen) / o.batch_episodes))
        lengths = [sum(len(s) for s in self.episodes[i].segments) for i in chosen]
        torch.set_num_threads(cfg.run.train_threads)
        policy.actor.model.train()
        self.host.rep.start(f"offline actor ({o.algo}, round {round_ + 1})", steps)
        batches: list[list[int]] = []
        for k in range(steps):
            if not batches:
                batches = length_batches(lengths, o.batch_episodes, policy.py_rng)
            mb = [chosen[j] for j in batches.pop()]
            for g in opt.param_groups:  # linear warm-up
                g["lr"] = o.lr * min(1.0, (k + 1) / o.warmup_steps) if o.warmup_steps else o.lr
            acc = MicroStats()
            _, norm = policy.step(self._actor_losses(policy, mb, weights, acc), opt,
                                  policy.actor.trainable_parameters(), cfg.actor.max_grad_norm,
                                  where=f"offline actor step {k}")
            self.step += 1
            self.host.rep.advance(1)
            m = {f"offline/{n}": v for n, v in acc.result().items()}
            self._log("offline_actor", {**m, **wm, "offline/lr": opt.param_groups[0]["lr"], "grad/actor_norm": norm},
                      at=k, force=k == steps - 1)

    def _actor_losses(self, policy: Policy, mb: Sequence[int], weights: torch.Tensor,
                      acc: MicroStats) -> Iterator[torch.Tensor]:
        """Minibatch ``mb``'s weighted NLL as micro-batch losses, each weighted by its share of the action tokens."""
        eps = [self.episodes[i] for i in mb]
        n_act = max(1, sum(action_tokens(ep.segments) for ep in eps))
        for micro in micro_batches([[len(s) for s in ep.segments] for ep in eps], self.cfg.actor.microbatch_tokens):
            sub = [eps[j] for j in micro]
            acc.count([[len(s) for s in ep.segments] for ep in sub])
            batch = make_token_batch([(j, seg) for j, ep in enumerate(sub) for seg in ep.segments],
                                     pad_id=policy.actor.pad_id, device=policy.runtime.device)
            po = policy_output(policy.actor, batch)
            w_tok = segment_advantages(weights[[mb[j] for j in micro]], batch)
            out = weighted_nll(po.logprobs, w_tok, batch.action_mask, correct=po.correct)
            share = sum(action_tokens(ep.segments) for ep in sub) / n_act
            acc.add({"actor_loss": out["loss"], "nll": out["nll"], "token_accuracy": out["token_accuracy"]}, share)
            yield share * out["loss"]


def micro_forward(net: SeparateCritic, inputs: Sequence[CriticInput], budget: int | None) -> dict[str, torch.Tensor]:
    """``net``'s outputs (float32) for ``inputs``, in their order, computed in length-sorted micro-batches of at most
    ``budget`` padded tokens: one graph (one backward), about half the padded tokens of one batch."""
    enc = net.encode(inputs)
    micros = micro_batches([[n] for n in enc["attention_mask"].sum(1).tolist()], budget)
    parts: dict[str, list[torch.Tensor]] = {}
    for micro in micros:
        for k, v in net(encoded_rows(enc, micro)).items():
            parts.setdefault(k, []).append(v.float())
    back = torch.argsort(torch.tensor([i for micro in micros for i in micro]))  # the rows' order again
    return {k: torch.cat(v)[back.to(v[0].device)] for k, v in parts.items()}


def _critic_step(learner: SeparateLearner, loss: torch.Tensor) -> float:
    """One step of the critic's own optimizer (skipped, and the norm returned, when the gradient is not finite)."""
    learner.opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(learner.critic.parameters(), learner.cfg.max_grad_norm)
    if torch.isfinite(norm):
        learner.opt.step()
    return float(norm)


def _drop_records_from(logger: RunLogger, step: int) -> None:
    """Drop offline records at ``step`` or later from the metrics log (those of a killed attempt at the phase)."""
    if not logger.path.is_file():
        return
    recs = read_jsonl(logger.path)
    keep = [r for r in recs if not (str(r.get("phase", "")).startswith("offline") and r.get("step", -1) >= step)]
    if len(keep) != len(recs):
        write_jsonl(logger.path, keep)
