"""The training loop: BC -> critic warm-up -> mixed BC+RL -> PPO, read top to bottom.

One RL iteration, with its stages named and timed as verl does::

    gen            collect episodes with the current policy (batched, many envs)
    values         critic values V(s_t) per turn (+ V(s_T) where the episode end bootstraps: critics.bootstraps)
    adv            turn-level GAE (or the group-relative baseline for critic.kind none)
    update_critic  the critic's own optimizer (skipped for none; folded into the actor for shared)
    update_actor   token-level PPO-clip on action tokens (+ w_bc * BC in the mixed phase); with
                   ppo.algo rft, the NLL of the successful episodes' actions instead

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

import contextlib
import copy
import dataclasses
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from polyturn.algos.baselines import group_relative_advantages
from polyturn.algos.bc import bc_loss
from polyturn.algos.gae import normalize, turn_gae
from polyturn.algos.ppo import a2c_loss, ppo_loss
from polyturn.algos.value import explained_variance
from polyturn.config import TrainConfig, save_config
from polyturn.demos import write_jsonl
from polyturn.eval.rollouts import held_out_tasks, run_actor
from polyturn.eval.signals import read_records
from polyturn.models.actor import Actor, load_actor
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import DemoTokens, tokenize_demo
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime
from polyturn.train import checkpoint as ckpt
from polyturn.train import distributed
from polyturn.train.batch import (
    MicroStats,
    TokenBatch,
    action_tokens,
    length_batches,
    make_token_batch,
    micro_batches,
    policy_output,
    segment_advantages,
)
from polyturn.train.critics import turn_tensors
from polyturn.train.guard import guarded_step
from polyturn.train.logger import RunLogger
from polyturn.train.reporting import NullReporter, Reporter, summarize_episodes
from polyturn.train.setup import (
    build_actor,
    build_critic,
    load_or_make_demos,
    make_envs,
    rollout_settings,
)

if TYPE_CHECKING:
    from polyturn.train.remote import RemoteCollection


#: Demonstration actions cut at rollout.max_action_tokens, as a share of all of them, above which BC refuses to run.
MAX_CUT_SHARE = 0.02
#: A PPO minibatch whose approx_kl (measured before its step) passes this multiple of ppo.target_kl is not
#: stepped, and the update ends there (SB3 stops at 1.5x; the epoch-mean limit of ppo.target_kl also applies).
KL_STOP = 2.0


class NonFiniteError(RuntimeError):
    """A loss or gradient was not finite and ``run.on_nonfinite`` is ``stop``."""


class Trainer:
    """Runs the phases of a :class:`TrainConfig`; ``resume=True`` continues from the run's last checkpoint."""

    def __init__(self, cfg: TrainConfig, *, reporter: Reporter | None = None, resume: bool = False) -> None:
        self.cfg = cfg
        self.rep = reporter or NullReporter()
        # Under torchrun (polyturn.train.distributed) rank 0 owns out_dir; the other ranks log under out_dir/rank<r>.
        if distributed.setup(cfg.run.device) and (cfg.critic.target == "td" or cfg.rollout.workers):
            raise ValueError("Expected one process per run with critic.target = td (one replay buffer) or "
                             f"rollout.workers > 0 (one learner), got --nproc {distributed.world_size()}: "
                             "use critic.target=gae and rollout.workers=0 with --nproc, or train in one process")
        main_out = Path(cfg.run.out_dir)
        self.out = main_out / f"rank{distributed.rank()}" if distributed.rank() else main_out
        self.out.mkdir(parents=True, exist_ok=True)
        self.resume_from = ckpt.latest(main_out) if resume else None
        if resume and self.resume_from is None:
            raise FileNotFoundError(f"--resume: no checkpoint found in {self.out} (expected {self.out}/latest)")
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)
        self.rng = np.random.default_rng(cfg.run.seed)
        # One device and one precision for the run; the sampling generator lives on that device.
        self.runtime = Runtime.from_config(cfg.run.device, cfg.run.precision)
        self.gen = self.runtime.generator(cfg.run.seed)
        self.scaler = self.runtime.grad_scaler()  # fp16 only
        self.py_rng = random.Random(cfg.run.seed)
        save_config(cfg, self.out / "config.yaml")

        self.rep.start("demonstrations", cfg.bc.episodes if not cfg.bc.demos else 0)
        self.demos = load_or_make_demos(cfg, self.out, progress=self.rep.advance)
        if not self.demos:
            raise ValueError("Expected at least one demonstration episode, got none")
        self.envs = make_envs(cfg, cfg.rollout.num_envs)
        _, info0 = self.envs[0].reset(seed=cfg.env.train_seed_start)
        self.feature_names = sorted(info0.get("features", {}))
        tool_docs = self.envs[0].unwrapped.tool_docs()
        self.settings = rollout_settings(cfg)

        self.state: dict[str, Any] = {"phase": "bc", "iter": 0, "bc_step": 0, "eval": {}, "skipped": 0,
                                      "task_counter": cfg.env.train_seed_start + cfg.bc.episodes}
        if self.resume_from is not None:
            self.actor = load_actor(self.resume_from / "actor")
        elif cfg.actor.init_from:
            src = Path(cfg.actor.init_from)
            src = src / "actor" if (src / "actor").is_dir() else src
            if not src.is_dir():
                raise FileNotFoundError(f"actor.init_from = {cfg.actor.init_from!r}: no such checkpoint directory")
            self.actor = load_actor(src)
            self.state["phase"] = "rl"  # the given actor replaces phase 1
        else:
            self.actor = build_actor(cfg, self.demos, tool_docs)
        self.actor.to(self.runtime)
        if cfg.actor.gradient_checkpointing:
            self.actor.enable_gradient_checkpointing()
        self.critic = build_critic(cfg, self.demos, self.actor, self.feature_names)
        self.critic.to(self.runtime)
        self.actor_opt = self._make_actor_opt()
        self.ref_actor: Actor | None = None
        self.logger = RunLogger(self.out, tensorboard=cfg.run.tensorboard)
        if self.resume_from is not None:
            self._restore(self.resume_from)
        self.collector = Collector(self.actor, self.envs, env_id=cfg.env.id, settings=self.settings,
                                   env_threads=cfg.rollout.env_threads)
        # rollout.workers > 0: Ray actors collect the RL batches (polyturn.train.remote; started when RL starts,
        # with the weights it starts from); evaluation stays in this process.
        self.remote: RemoteCollection | None = None
        # BC reads each demonstration in the context a rollout of its task samples from: the same system
        # prompt (the tool docs of a task reset without options, as the demonstrations were played).
        system = tool_docs if self.settings.system_prompt else None
        demo_tokens = [tokenize_demo(self.actor, self.settings, rec, system=system) for rec in self.demos]
        self._demo_items = [d.segments for d in demo_tokens]
        self.demo_cut = self._check_cut_actions(demo_tokens)

    def _check_cut_actions(self, demo_tokens: Sequence[DemoTokens]) -> dict[str, float]:
        """Count demonstration actions cut at ``rollout.max_action_tokens``; report them, refuse too many."""
        n = sum(d.n_actions for d in demo_tokens)
        cut = sum(d.n_cut for d in demo_tokens)
        longest = max((d.longest_action for d in demo_tokens), default=0)
        share = cut / max(1, n)
        cap = self.cfg.rollout.max_action_tokens
        if cut:
            self.rep.message(f"BC: {cut} of {n} demonstration actions ({share:.1%}) are longer than "
                             f"rollout.max_action_tokens = {cap} and were cut (longest: {longest} tokens)")
        if share > MAX_CUT_SHARE:
            raise ValueError(
                f"Expected at most {MAX_CUT_SHARE:.0%} of demonstration actions to be longer than "
                f"rollout.max_action_tokens = {cap} tokens, got {cut} of {n} ({share:.1%}; the longest is {longest} "
                f"tokens, stop token included). BC on a cut action teaches the actor to stop early: raise "
                f"rollout.max_action_tokens to at least {longest} (and rollout.context_budget with it), or use "
                "demonstrations with shorter actions."
            )
        return {"bc/cut_actions": float(cut), "bc/cut_share": share}

    def _make_actor_opt(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.actor.trainable_parameters(), lr=self.cfg.actor.lr)

    def _actor_lr_factor(self) -> float:
        """Linear warm-up over the first RL optimizer steps (counted in the state, so resume continues it)."""
        warm = self.cfg.actor.warmup_steps
        return min(1.0, (self.state.get("actor_steps", 0) + 1) / warm) if warm else 1.0

    # ---- phases ---------------------------------------------------------------
    @property
    def rl_total(self) -> int:
        c = self.cfg.curriculum
        return c.warmup_iters + c.mixed_iters + c.ppo_iters

    def phase_of(self, it: int) -> str:
        c = self.cfg.curriculum
        if it < c.warmup_iters:
            return "warmup"
        if it < c.warmup_iters + c.mixed_iters:
            return "mixed"
        return "ppo"

    def run(self) -> dict[str, Any]:
        """Run every remaining phase; returns the summary (also written to ``summary.json``)."""
        t0 = time.time()
        if self.state["phase"] == "bc":
            with self._timed("bc"):
                self.behaviour_cloning()
            with self._timed("eval_bc"):
                self.evaluate_all("bc")
            self.state["phase"] = "rl"
            self._set_reference()
            self.save("ckpt-bc")
        elif "bc" not in self.state["eval"]:  # started from actor.init_from: evaluate the starting policy
            with self._timed("eval_bc"):
                self.evaluate_all("bc")
        self._set_reference()
        self.rep.start("rl", self.rl_total - self.state["iter"])
        if self.state["iter"] < self.rl_total:
            # Resumed with more iterations than an earlier, finished run: its final evaluation is stale.
            for tag in ("final", "final_sampled"):
                self.state["eval"].pop(tag, None)
        while self.state["iter"] < self.rl_total:
            with self._timed("rl"):
                self.rl_iteration(self.state["iter"])
            self.state["iter"] += 1
            self.rep.advance(1)
            if self.state["iter"] % self.cfg.run.checkpoint_every == 0 or self.state["iter"] == self.rl_total:
                self.save(f"ckpt-iter{self.state['iter']:04d}")
        if self.remote is not None:
            self.remote.close()
        if "final" not in self.state["eval"]:
            with self._timed("eval_final"):
                self.evaluate_all("final")
            self.save("ckpt-final")
        summary = {"eval": self.state["eval"], "wall_s": time.time() - t0, "skipped_updates": self.state["skipped"],
                   "phase_s": dict(self.state.get("phase_s", {}))}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.logger.close()
        return summary

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        """Add the block's wall seconds to ``state["phase_s"][phase]`` (kept in checkpoints, so a resumed run's
        summary.json counts the phases' time before the kill too; what a killed step had spent is lost)."""
        t = time.time()
        yield
        spent = self.state.setdefault("phase_s", {})
        spent[phase] = spent.get(phase, 0.0) + time.time() - t

    # ---- phase 1: behaviour cloning --------------------------------------------
    def _bc_batch_loss(self, idx: Sequence[int], acc: MicroStats, *, weight: float = 1.0) -> Iterator[torch.Tensor]:
        """``weight`` x the BC loss of demonstrations ``idx``, as micro-batch losses (see :meth:`update_actor`).

        Each is weighted by its share of the batch's action tokens (``bc_loss`` is a token mean);
        ``losses/bc_loss`` and ``bc/token_accuracy`` of the whole batch go into ``acc``.
        """
        demos = [self._demo_items[i] for i in idx]
        n_act = max(1, sum(action_tokens(segs) for segs in demos))
        for micro in distributed.shard(micro_batches([[len(s) for s in segs] for segs in demos],
                                                     self.cfg.actor.microbatch_tokens)):
            sub = [demos[k] for k in micro]
            acc.count([[len(s) for s in segs] for segs in sub])
            batch = make_token_batch([(j, seg) for j, segs in enumerate(sub) for seg in segs],
                                     pad_id=self.actor.pad_id, device=self.runtime.device)
            po = policy_output(self.actor, batch)
            out = bc_loss(po.logprobs, batch.action_mask, correct=po.correct)
            share = sum(action_tokens(segs) for segs in sub) / n_act
            acc.add({"losses/bc_loss": out["loss"], "bc/token_accuracy": out["token_accuracy"]}, share)
            yield weight * share * out["loss"]

    def behaviour_cloning(self) -> None:
        """Phase 1: maximise the likelihood of the demonstrations' action tokens."""
        b = self.cfg.bc
        n = len(self._demo_items)
        steps = max(1, math.ceil(b.epochs * n / b.batch_episodes))
        opt = torch.optim.AdamW(self.actor.trainable_parameters(), lr=b.lr)

        def lr_at(step: int) -> float:  # linear warm-up, then cosine to 10%
            if step < b.warmup_steps:
                return (step + 1) / b.warmup_steps
            p = (step - b.warmup_steps) / max(1, steps - b.warmup_steps)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        torch.set_num_threads(self.cfg.run.train_threads)
        self.actor.model.train()
        self.rep.start("bc", steps)
        lengths = [sum(len(seg) for seg in segs) for segs in self._demo_items]
        batches: list[list[int]] = []
        real = padded = 0  # tokens of the micro-batches run so far (perf/bc_padding)
        for step in range(steps):
            if not batches:
                batches = length_batches(lengths, b.batch_episodes, self.py_rng)
            idx = batches.pop()
            acc = MicroStats()
            ok, norm = self._guarded_step(self._bc_batch_loss(idx, acc), opt, self.actor.trainable_parameters(),
                                          self.cfg.actor.max_grad_norm, where=f"bc step {step}")
            real, padded = real + acc.real, padded + acc.padded
            sched.step()
            self.rep.advance(1)
            if step % 10 == 0 or step == steps - 1:
                m = {**acc.result(), "bc/lr": sched.get_last_lr()[0], "grad/actor_norm": norm,
                     "perf/bc_padding": 1 - real / max(1, padded), **self.demo_cut}
                self.logger.log(step, {"phase": "bc", **m})
                self.rep.metrics("bc", step, m)
        self.state["bc_step"] = steps

    # ---- phases 2-4: RL ----------------------------------------------------------
    def next_tasks(self, n: int, progress: float) -> list[dict]:
        """Training tasks for one iteration, shaped by the curriculum stage."""
        stage = self.cfg.curriculum.stage_at(progress)
        group = self.cfg.critic.group_size if self.cfg.critic.kind == "none" else 1
        tasks = []
        for _ in range(max(1, n // group)):
            seed = self.state["task_counter"]
            self.state["task_counter"] += 1
            opts: dict[str, Any] = {}
            if stage.levels:
                opts["level"] = int(self.rng.choice(stage.levels))
            if stage.max_turns:
                opts["max_turns"] = stage.max_turns
            if stage.tools:
                opts["tools"] = list(stage.tools)
            tasks += [{"seed": seed, "options": opts}] * group
        return tasks

    def rl_iteration(self, it: int) -> dict[str, Any]:
        """gen -> values -> adv -> update_critic -> update_actor for one batch of episodes."""
        cfg, cur = self.cfg, self.cfg.curriculum
        progress = it / max(1, self.rl_total)
        t = time.perf_counter()
        if cfg.rollout.workers:  # rollout workers: gather this iteration's batch, learn, send the weights
            if self.remote is None:
                from polyturn.train.remote import RemoteCollection

                self.remote = RemoteCollection(self)
            episodes, extra = self.remote.episodes(it)
            out = self.learn(it, episodes, gen_s=time.perf_counter() - t, extra=extra)
            self.remote.after_update()
            return out
        torch.set_num_threads(cfg.run.rollout_threads)
        self.actor.model.eval()
        tasks = self.next_tasks(cfg.ppo.episodes_per_iter, progress)
        # Under torchrun each process plays its share of the tasks (its own exploration draws, so the shared
        # task stream stays the same on every rank) and then every process holds the whole batch, in task order.
        rng = np.random.default_rng([cfg.run.seed, it, distributed.rank()]) if distributed.active() else self.rng
        episodes = self.collector.collect(distributed.shard(tasks), temperature=cur.temperature.at(progress),
                                          epsilon=cur.epsilon.at(progress), rng=rng, generator=self.gen)
        episodes = distributed.gather_in_order(episodes)
        return self.learn(it, episodes, gen_s=time.perf_counter() - t)

    def learn(self, it: int, episodes: Sequence[Episode], *, gen_s: float,
              extra: dict[str, float] | None = None) -> dict[str, Any]:
        """values -> adv -> update_critic -> update_actor on iteration ``it``'s episodes (sampled in ``gen_s``;
        ``extra``: the collection's own metrics, logged with the rest)."""
        cfg, cur = self.cfg, self.cfg.curriculum
        phase = self.phase_of(it)
        progress = it / max(1, self.rl_total)
        gamma, temp = cur.gamma.at(progress), cur.temperature.at(progress)
        eps, ent_coef = cur.epsilon.at(progress), cur.ent_coef.at(progress)
        timings: dict[str, float] = {"perf/gen_s": gen_s}
        torch.set_num_threads(cfg.run.train_threads)
        t = time.perf_counter()
        tt = turn_tensors(episodes)
        tt["rewards"] = tt["rewards"] * cfg.ppo.reward_scale
        full = make_token_batch([(i, s) for i, ep in enumerate(episodes) for s in ep.segments],
                                pad_id=self.actor.pad_id, device=self.runtime.device)
        values, next_values = self.critic.values(episodes, full)
        timings["perf/values_s"] = time.perf_counter() - t

        t = time.perf_counter()
        if cfg.critic.kind == "none":
            rets = torch.tensor([ep.episode_return for ep in episodes]) * cfg.ppo.reward_scale
            groups = torch.tensor([ep.seed for ep in episodes])  # an episode's seed is its task's
            adv = group_relative_advantages(rets, groups)[:, None] * tt["mask"]
            returns = tt["rewards"].flip(1).cumsum(1).flip(1) * tt["mask"]
        else:
            adv, returns = turn_gae(tt["rewards"], values, next_values, tt["terminated"], tt["mask"],
                                    gamma=gamma, lam=cfg.ppo.lam)
        if cfg.ppo.normalize_advantages:
            # Whiten as the token-level loss sees them: each turn counts once per action token.
            n_tok = torch.zeros_like(adv)
            for i, ep in enumerate(episodes):
                for j, turn in enumerate(ep.turns):
                    n_tok[i, j] = len(turn.action_ids)
            adv = normalize(adv, tt["mask"], weights=n_tok)
        timings["perf/adv_s"] = time.perf_counter() - t

        metrics: dict[str, Any] = {"phase": phase, "iter": it}
        t = time.perf_counter()
        metrics.update(self.critic.update(episodes, returns, values, gamma=gamma, reward_scale=cfg.ppo.reward_scale,
                                          with_actor=phase != "warmup"))
        timings["perf/update_critic_s"] = time.perf_counter() - t

        t = time.perf_counter()
        if phase != "warmup":
            w_bc, w_rl = (cur.w_bc, cur.w_rl) if phase == "mixed" else (0.0, 1.0)
            chosen, adv = self.actor_episodes(episodes, adv, tt["mask"])
            if cfg.ppo.algo == "rft":
                metrics["rft/kept"] = len(chosen)
            if chosen:
                metrics.update(self.update_actor([episodes[i] for i in chosen], adv[chosen], returns[chosen],
                                                 values[chosen], temperature=temp, ent_coef=ent_coef,
                                                 w_bc=w_bc, w_rl=w_rl))
        timings["perf/update_actor_s"] = time.perf_counter() - t

        n_turns = sum(len(ep.turns) for ep in episodes)
        n_tokens = sum(len(tr.action_ids) for ep in episodes for tr in ep.turns)
        if cfg.critic.kind != "none":
            ev = explained_variance(values, returns, tt["mask"])
            metrics["losses/explained_variance"] = float(ev)
        metrics.update(summarize_episodes(episodes))
        metrics.update(timings)
        metrics.update(extra or {})
        metrics.update({
            "perf/turns_per_s": n_turns / timings["perf/gen_s"],
            "perf/tokens_per_s": n_tokens / timings["perf/gen_s"],
            "schedule/gamma": gamma, "schedule/temperature": temp, "schedule/epsilon": eps,
            "schedule/ent_coef": ent_coef, "schedule/progress": progress,
            "guard/skipped_total": self.state["skipped"],
        })
        self.logger.log(self.state["bc_step"] + it, metrics)
        self.rep.metrics(phase, it, metrics)
        if cfg.run.diagnose_every and (it + 1) % cfg.run.diagnose_every == 0:
            self.health_check()
        return metrics

    def health_check(self) -> list[str]:
        """The checks of ``polyturn diagnose`` on the log so far; each new warning goes to the reporter at once.

        Warnings already reported (kept in the checkpointed state) are not repeated. Returns the new messages.
        """
        from polyturn.eval.checks import check_all, format_warning, updates_per_iter

        warned = self.state.setdefault("warned", [])
        new = []
        for w in check_all(read_records(self.logger.path), updates_per_iter=updates_per_iter(self.cfg)):
            if f"{w.kind}:{w.metric}" not in warned:
                warned.append(f"{w.kind}:{w.metric}")
                new.append(format_warning(w, plot_dir=self.out / "diagnose",
                                          drawn_by=f"polyturn diagnose --run {self.out} --episodes 0"))
                self.rep.message(new[-1])
        return new

    def actor_episodes(self, episodes: Sequence[Episode], adv: torch.Tensor,
                       mask: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """The episodes the actor step trains on (indices) and the ``[E, T]`` advantages it reads.

        Every episode with its own advantages; with ``ppo.algo`` rft (rejection-sampling fine-tuning) the
        successful episodes only, each of their turns weighted 1, which makes the policy-gradient loss the
        token-mean NLL of their actions: the policy imitates what worked and never pushes a sampled action down.
        With ``ppo.rft_valid_only`` a success that contains an invalid action is dropped too.
        """
        if self.cfg.ppo.algo != "rft":
            return list(range(len(episodes))), adv
        valid_only = self.cfg.ppo.rft_valid_only
        return [i for i, ep in enumerate(episodes)
                if ep.success and (not valid_only or all(t.valid for t in ep.turns))], mask

    def update_actor(self, episodes: Sequence[Episode], adv: torch.Tensor, returns: torch.Tensor,
                     old_values: torch.Tensor, *, temperature: float, ent_coef: float, w_bc: float,
                     w_rl: float) -> dict[str, float]:
        """Token-level PPO-clip (or A2C) over minibatches of episodes, early-stopped on approx_kl.

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
        epochs = 1 if p.algo == "a2c" else p.epochs
        stats: dict[str, list[float]] = {}
        real = padded = 0
        idx = list(range(len(episodes)))
        stopped = False
        for _epoch in range(epochs):
            self.py_rng.shuffle(idx)
            kls = []
            for s in range(0, len(idx), p.minibatch_episodes):
                mb = idx[s : s + p.minibatch_episodes]
                acc = MicroStats()
                parts: Iterable[torch.Tensor] = self._rl_losses(
                    [episodes[i] for i in mb], adv[mb], returns[mb], old_values[mb], acc,
                    temperature=temperature, ent_coef=ent_coef, weight=w_rl)
                if w_bc > 0:
                    demo_idx = self.py_rng.sample(range(len(self._demo_items)), min(len(mb), len(self._demo_items)))
                    parts = itertools.chain(parts, self._bc_batch_loss(demo_idx, acc, weight=w_bc))
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
                   acc: MicroStats, *, temperature: float, ent_coef: float, weight: float) -> Iterator[torch.Tensor]:
        """One minibatch's ``weight`` x policy loss (+ the shared critic's loss) as weighted micro-batch losses.

        ``adv``, ``returns``, ``old_values`` are the minibatch's ``[E, T]`` rows; the minibatch's
        statistics go into ``acc``. A micro-batch's losses are computed only when the previous one's
        backward is done (a generator), so one micro-batch's activations are alive at a time.
        """
        p = self.cfg.ppo
        n_act = max(1, sum(action_tokens(ep.segments) for ep in eps))
        n_turns = max(1, sum(len(ep.turns) for ep in eps))
        for micro in distributed.shard(micro_batches([[len(s) for s in ep.segments] for ep in eps],
                                                     self.cfg.actor.microbatch_tokens)):
            sub = [eps[j] for j in micro]
            acc.count([[len(s) for s in ep.segments] for ep in sub])
            batch = make_token_batch([(j, seg) for j, ep in enumerate(sub) for seg in ep.segments],
                                     pad_id=self.actor.pad_id, device=self.runtime.device)
            loss = torch.zeros(())
            po = policy_output(self.actor, batch, temperature=temperature)
            critic_loss, critic_stats = self.critic.actor_loss(sub, batch, po.hidden, returns[micro], old_values[micro])
            turn_share = sum(len(ep.turns) for ep in sub) / n_turns
            if critic_loss is not None:
                loss = loss + turn_share * critic_loss
            acc.add(critic_stats, turn_share)
            adv_tok = segment_advantages(adv[micro], batch)
            if p.algo in ("a2c", "rft"):  # rft: advantages of 1 make this the NLL of the kept actions
                out = a2c_loss(po.logprobs, adv_tok, batch.action_mask, entropy=po.entropy, ent_coef=ent_coef)
            else:
                ref = self._ref_logprobs(batch, temperature) if self.ref_actor is not None else None
                out = ppo_loss(po.logprobs, batch.old_logprobs, adv_tok, batch.action_mask, clip_eps=p.clip,
                               dual_clip=p.dual_clip, entropy=po.entropy, ent_coef=ent_coef, ref_logprobs=ref,
                               kl_coef=p.kl_coef)
            share = sum(action_tokens(ep.segments) for ep in sub) / n_act
            acc.add({f"losses/{k}" if k != "loss" else "losses/actor_loss": v for k, v in out.items()}, share)
            yield loss + weight * share * out["loss"]

    def _set_reference(self) -> None:
        """The KL reference (``ppo.kl_coef > 0``): a frozen copy of the policy RL starts from, i.e. the BC policy.

        Made once, when RL starts (after BC, or from ``actor.init_from``); every
        checkpoint keeps it (``ref_actor/``) and resume restores it from there.
        """
        if self.cfg.ppo.kl_coef > 0 and self.ref_actor is None:
            ref = copy.deepcopy(self.actor.model).requires_grad_(False).eval()
            self.ref_actor = dataclasses.replace(self.actor, model=ref)

    def _restore_reference(self, directory: Path) -> None:
        """On resume: the checkpoint's ``ref_actor/``, else the run's BC checkpoint, else ``actor.init_from``."""
        if self.cfg.ppo.kl_coef <= 0 or self.state["phase"] != "rl":
            return  # resumed during BC: the reference is made when BC ends
        init = Path(self.cfg.actor.init_from) if self.cfg.actor.init_from else None
        candidates = [directory / "ref_actor", Path(self.cfg.run.out_dir) / "ckpt-bc" / "actor"]
        if init is not None:
            candidates.append(init / "actor" if (init / "actor").is_dir() else init)
        src = next((c for c in candidates if c.is_dir()), None)
        if src is None:
            raise FileNotFoundError(
                f"ppo.kl_coef = {self.cfg.ppo.kl_coef} needs the BC policy as the KL reference; expected it in "
                f"{candidates[0]} or {candidates[1]}, found neither. Resume with ppo.kl_coef=0, or start a new run."
            )
        if src != candidates[0]:
            self.rep.message(f"KL reference: {directory.name} holds none (written with ppo.kl_coef = 0?); "
                             f"using the BC policy in {src}")
        with torch.random.fork_rng():  # building the model draws random inits: keep the restored RNG streams exact
            ref = load_actor(src).to(self.actor.runtime)
        ref.model.requires_grad_(False).eval()
        self.ref_actor = ref

    @torch.no_grad()
    def _ref_logprobs(self, batch: TokenBatch, temperature: float) -> torch.Tensor:
        return policy_output(self.ref_actor, batch, temperature=temperature).logprobs

    def _guarded_step(self, loss: torch.Tensor | Iterable[torch.Tensor], opt: torch.optim.Optimizer, params: list,
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
        self.state["skipped"] += 1
        self.rep.message(f"skipped an update: non-finite {what}")
        return False

    # ---- evaluation and checkpoints ------------------------------------------------
    def evaluate_all(self, tag: str) -> None:
        """Held-out evaluation with greedy decoding (and sampled, when configured), stored in the state."""
        self.state["eval"][tag] = self.evaluate(tag, temperature=self.cfg.rollout.eval_temperature)
        if self.cfg.rollout.eval_sampled_temperature is not None:
            self.state["eval"][f"{tag}_sampled"] = self.evaluate(
                f"{tag}_sampled", temperature=self.cfg.rollout.eval_sampled_temperature
            )

    def evaluate(self, tag: str, *, temperature: float) -> dict[str, float]:
        """Success on held-out task seeds (never trained on)."""
        cfg = self.cfg
        torch.set_num_threads(cfg.run.rollout_threads)
        self.actor.model.eval()
        tasks = held_out_tasks(cfg, cfg.env.eval_episodes)
        self.rep.start(f"eval {tag}", len(tasks))
        episodes = run_actor(self.collector, tasks, temperature=temperature, seed=cfg.run.seed,
                             progress=self.rep.advance, label=tag)
        write_jsonl(self.out / f"eval_{tag}.jsonl", [ep.to_record() for ep in episodes])
        m = summarize_episodes(episodes)
        res = {"success_rate": m["charts/success_rate"], "return_mean": m["charts/return_mean"],
               "turns_mean": m["charts/turns_mean"], "invalid_action_rate": m["charts/invalid_action_rate"],
               "episodes": len(episodes), "temperature": temperature}
        self.logger.log(self.state["bc_step"] + self.state["iter"], {"phase": f"eval_{tag}",
                                                                      **{f"eval/{k}": v for k, v in res.items()}})
        self.rep.metrics(f"eval_{tag}", self.state["iter"], {f"eval/{k}": v for k, v in res.items()})
        return res

    def save(self, name: str) -> Path:
        """Write a checkpoint directory and point ``latest`` at it (rank 0 only, under torchrun)."""
        if distributed.rank() != 0:
            return Path(self.cfg.run.out_dir) / name
        return ckpt.save(
            self.out / name,
            actor=self.actor,
            critic=self.critic,
            cfg=self.cfg,
            state=self.state,
            optimizers={"actor": self.actor_opt, **self.critic.optimizers()},
            rngs={"np": self.rng, "torch_gen": self.gen, "py": self.py_rng},
            run_dir=self.out,
            ref_actor=self.ref_actor,
        )

    def _restore(self, directory: Path) -> None:
        self.critic.load(directory)
        self.actor_opt = self._make_actor_opt()
        self.state = ckpt.load_state(
            directory,
            optimizers={"actor": self.actor_opt, **self.critic.optimizers()},
            rngs={"np": self.rng, "torch_gen": self.gen, "py": self.py_rng},
        )
        self._restore_reference(directory)
        self.logger.drop_from_iter(self.state["iter"])
        self.rep.message(f"resumed from {directory} at RL iteration {self.state['iter']}")
