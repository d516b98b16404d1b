"""The training loop: BC -> critic warm-up -> mixed BC+RL -> PPO, read top to bottom.

One RL iteration, with its stages named and timed as verl does::

    gen            collect episodes with the current policy (batched, many envs)
    values         critic values V(s_t) per turn (+ V(s_T) where the episode end bootstraps: critics.bootstraps)
    adv            the critic's advantages: turn-level GAE, the group-relative baseline (critic.kind none),
                   or the action-level critic's per-turn scores (critic.kind action)
    update_critic  the critic's own optimizer (skipped for none; folded into the actor for shared); a
                   critic whose update never reads the actor (``CriticLearner.update_apart``) trains on
                   the cores sampling leaves idle, beside the next iteration's gen (``run.critic_beside``)
    update_actor   the ppo.algo's update (polyturn.train.algorithms): token-level PPO-clip on action
                   tokens, rft's NLL of the successful episodes' actions, turn-level DPO, ...
                   (+ w_bc * BC in the mixed phase)

The run holds a :class:`~polyturn.train.policy.Policy` per role (its actor, optimizer, reference, guarded step and
BC loss) with its critic learner (:mod:`polyturn.train.critics`, one class per kind from a registry) and policy
update (:mod:`polyturn.train.algorithms`): the loop never asks which critic or update it runs. Phase 1 lives in
:mod:`polyturn.train.bc_phase`, held-out evaluation in :mod:`polyturn.train.evaluation`.

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

import functools
import gc
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polyturn.acting.checkpoint import rollout_settings
from polyturn.algos.gae import normalize
from polyturn.algos.value import explained_variance
from polyturn.config import TrainConfig, save_config
from polyturn.health.checks import check_all, format_warning, updates_per_iter
from polyturn.health.signals import read_records
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import tokenize_demo
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime, machine, release_host_memory, resident_bytes
from polyturn.train import checkpoint as ckpt
from polyturn.train import distributed
from polyturn.train.algorithms import PG_UPDATES, PolicyUpdate
from polyturn.train.batch import make_token_batch
from polyturn.train.bc_phase import behaviour_cloning, check_cut_actions
from polyturn.train.critic_beside import CriticBeside, timed_update
from polyturn.train.critics import build_critic, check_critic, turn_tensors
from polyturn.train.evaluation import HeldOut
from polyturn.train.logger import RunLogger
from polyturn.train.policy import NonFiniteError, Policy
from polyturn.train.remote import RemoteCollection, check_workers
from polyturn.train.reporting import NullReporter, Reporter, sampling_speed, summarize_episodes
from polyturn.train.setup import first_rl_seed, initial_actor, load_or_make_demos, make_envs
from polyturn.train.state import AGENT, RunState
from polyturn.train.tasks import TaskStream
from polyturn.train.turn_dpo import TurnDPO

#: Every policy update by its ``ppo.algo`` name.
POLICY_UPDATES: dict[str, type[PolicyUpdate]] = {**PG_UPDATES, "turn_dpo": TurnDPO}

__all__ = ["POLICY_UPDATES", "NonFiniteError", "Trainer", "check_run"]


def check_run(cfg: TrainConfig, *, world_size: int = 1) -> None:
    """``ValueError`` naming the field and the fix when ``cfg`` asks for what a run cannot do (its critic kind's,
    policy update's and rollout workers' own checks), before the run makes anything."""
    check_critic(cfg, world_size=world_size)
    POLICY_UPDATES[cfg.ppo.algo].check(cfg, world_size=world_size)
    check_workers(cfg, world_size=world_size)


class Trainer:
    """Runs the phases of a :class:`TrainConfig`; ``resume=True`` continues from the run's last checkpoint.

    A ``run.out_dir`` that holds an earlier run (its metrics log, summary or checkpoints) is refused unless the run
    resumes it or ``overwrite=True`` (``polyturn train --overwrite``) clears it first: a new run appending to the
    old one's ``metrics.jsonl`` and replacing its checkpoints would mix two runs and lose one.
    """

    def __init__(self, cfg: TrainConfig, *, reporter: Reporter | None = None, resume: bool = False,
                 overwrite: bool = False) -> None:
        self.cfg = cfg
        self.rep = reporter or NullReporter()
        # Under torchrun (polyturn.train.distributed) rank 0 owns out_dir; the other ranks log under out_dir/rank<r>.
        distributed.setup(cfg.run.device)
        check_run(cfg, world_size=distributed.world_size())
        self.out, self.resume_from = ckpt.open_run(Path(cfg.run.out_dir), resume=resume, overwrite=overwrite,
                                                   keep=Path(cfg.bc.demos) if cfg.bc.demos else None)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)
        self.rng = np.random.default_rng(cfg.run.seed)
        # One device and one precision for the run; the sampling generator lives on that device.
        self.runtime = Runtime.from_config(cfg.run.device, cfg.run.precision)
        self.gen = self.runtime.generator(cfg.run.seed)
        if self.runtime.emulated_bf16:
            self.rep.message(f"run.precision = bf16 on a CPU that reports {torch.backends.cpu.get_cpu_capability()}, "
                             "without AVX-512: bf16 is emulated there, ~27x slower than fp32 (measured); "
                             "set run.precision: fp32 on this machine")
        self.py_rng = random.Random(cfg.run.seed)
        save_config(cfg, self.out / "config.yaml")

        self.state = RunState()
        self.task_stream = TaskStream(cfg, self.state, self.rng)  # checks curriculum.group_shares first
        self.rep.start("demonstrations", cfg.bc.episodes if not cfg.bc.demos else 0)
        self.demos = load_or_make_demos(cfg, self.out, progress=self.rep.advance)
        if not self.demos:
            raise ValueError("Expected at least one demonstration episode, got none")
        self.state.task_counter = first_rl_seed(cfg, self.demos)
        self.envs = make_envs(cfg, cfg.rollout.num_envs)
        _, info0 = self.envs[0].reset(seed=cfg.env.train_seed_start)
        self.feature_names = sorted(info0.get("features", {}))
        tool_docs = self.envs[0].unwrapped.tool_docs()
        self.settings = rollout_settings(cfg)

        actor, given = initial_actor(cfg, self.demos, tool_docs, resume_from=self.resume_from)
        if given:
            self.state.phase = "rl"  # the given actor replaces phase 1
        actor.to(self.runtime)
        if cfg.actor.gradient_checkpointing:
            actor.enable_gradient_checkpointing()
        critic = build_critic(cfg, self.demos, actor, self.feature_names)
        critic.to(self.runtime)
        # BC reads each demonstration in the context a rollout of its task samples from: the same system
        # prompt (the tool docs of a task reset without options, as the demonstrations were played).
        system = tool_docs if self.settings.system_prompt else None
        demo_tokens = [tokenize_demo(actor, self.settings, rec, system=system) for rec in self.demos]
        self.demo_cut = check_cut_actions(demo_tokens, cap=cfg.rollout.max_action_tokens, rep=self.rep)
        self.policy = Policy(name=AGENT, actor=actor, critic=critic, demos=[d.segments for d in demo_tokens], cfg=cfg,
                             runtime=self.runtime, state=self.state, settings=self.settings, py_rng=self.py_rng,
                             gen=self.gen, on_message=self.rep.message)
        #: The run's policies by role: one, ``agent``, for a single-agent environment.
        self.policies: dict[str, Policy] = {AGENT: self.policy}
        self.algo = POLICY_UPDATES[cfg.ppo.algo](cfg.ppo)
        self.logger = RunLogger(self.out, tensorboard=cfg.run.tensorboard)
        self.critic_update = CriticBeside(cfg, critic, self.runtime)
        if self.resume_from is not None:
            self._restore(self.resume_from)
        self.collector = Collector(actor, self.envs, env_id=cfg.env.id, settings=self.settings,
                                   env_threads=cfg.rollout.env_threads)
        # Best-of-n (rollout.best_of) collects training episodes only: held-out evaluation samples plainly, since
        # a critic that reads privileged text cannot act at deployment.
        self.train_collector = self.collector
        if cfg.rollout.best_of > 1:
            self.train_collector = Collector(actor, self.envs, env_id=cfg.env.id, settings=self.settings,
                                             env_threads=cfg.rollout.env_threads, best_of=cfg.rollout.best_of,
                                             scorer=critic.scorer())
        self.held_out = HeldOut(cfg=cfg, collector=self.collector, out=self.out, logger=self.logger, rep=self.rep,
                                state=self.state, before=self.critic_update.finish)
        # rollout.workers > 0: Ray actors collect the RL batches (polyturn.train.remote; started when RL starts,
        # with the weights it starts from); evaluation stays in this process.
        self.remote: RemoteCollection | None = None

    # The single policy's parts, by the names the rest of polyturn (and its tests) read them.
    @property
    def actor(self):  # noqa: ANN201 - an Actor
        return self.policy.actor

    @property
    def critic(self):  # noqa: ANN201 - a CriticLearner
        return self.policy.critic

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
        st = self.state
        if st.phase == "bc":
            with st.timed("bc"):
                st.bc_step = behaviour_cloning(self.policy, logger=self.logger, rep=self.rep, extra=self.demo_cut)
            with st.timed("eval_bc"):
                self.held_out.all("bc")
            st.phase = "rl"
            self.policy.set_reference()
            self.save("ckpt-bc")
        elif "bc" not in st.eval and self.cfg.run.eval_start:  # from actor.init_from: its policy
            with st.timed("eval_bc"):
                self.held_out.all("bc")
        self.policy.set_reference()
        self.rep.start("rl", self.rl_total - st.iter)
        if st.iter < self.rl_total:
            # Resumed with more iterations than an earlier, finished run: its final evaluation is stale.
            for tag in ("final", "final_sampled"):
                st.eval.pop(tag, None)
        try:
            self._rl_loop()
        finally:
            self.critic_update.close()
        if self.remote is not None:
            self.remote.close()
        if "final" not in st.eval:
            with st.timed("eval_final"):
                if self.rl_total == 0 and "bc" in st.eval:  # no RL: the final policy is the one evaluated
                    self.held_out.copy("bc", "final")
                else:
                    self.held_out.all("final")
            self.save("ckpt-final")
        summary = {"eval": st.eval, "wall_s": time.time() - t0, "skipped_updates": st.skipped,
                   "phase_s": dict(st.phase_s),
                   "machine": machine(self.runtime.device, rollout_threads=self.cfg.run.rollout_threads,
                                      train_threads=self.cfg.run.train_threads)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.logger.close()
        self.task_stream.close()
        return summary

    def _rl_loop(self) -> None:
        # The setup's objects (models, tokenizers, the environments' data) live to the end: frozen, the garbage
        # collections of each iteration (release_host_memory's included) no longer walk them; measured on the demo,
        # that took release_host_memory from 0.56 s to 0.08 s an iteration.
        gc.collect()
        gc.freeze()
        st = self.state
        try:
            # Evaluations and save() first join a critic update still running beside sampling.
            while st.iter < self.rl_total:
                with st.timed("rl"):
                    self.rl_iteration(st.iter)
                st.iter += 1
                self.rep.advance(1)
                every = self.cfg.run.eval_every
                if every and st.iter % every == 0 and st.iter < self.rl_total:
                    tag = f"iter{st.iter:04d}"
                    with st.timed("eval_curve"):
                        st.eval[tag] = self.held_out.run(tag, temperature=self.cfg.rollout.eval_temperature)
                if st.iter % self.cfg.run.checkpoint_every == 0 or st.iter == self.rl_total:
                    self.save(f"ckpt-iter{st.iter:04d}")
        finally:
            gc.unfreeze()

    # ---- phases 2-4: RL ----------------------------------------------------------
    def next_tasks(self, n: int, progress: float) -> list[dict]:
        """Training tasks for one iteration, shaped by the curriculum stage."""
        return self.task_stream.next(n, progress, group=self.critic.task_group)

    def rl_iteration(self, it: int) -> dict[str, Any]:
        """gen -> values -> adv -> update_critic -> update_actor for one batch of episodes."""
        cfg, cur = self.cfg, self.cfg.curriculum
        progress = it / max(1, self.rl_total)
        t = time.perf_counter()
        if cfg.rollout.workers:  # rollout workers: gather this iteration's batch, learn, send the weights
            if self.remote is None:
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
        episodes = self.train_collector.collect(distributed.shard(tasks), temperature=cur.temperature.at(progress),
                                                epsilon=cur.epsilon.at(progress), rng=rng, generator=self.gen)
        episodes = distributed.gather_in_order(episodes)
        gen_s = time.perf_counter() - t
        extra = self.critic.collect_extra(self.train_collector, tasks, episodes, rng=self.py_rng,
                                          temperature=cur.temperature.at(progress), generator=self.gen)
        return self.learn(it, episodes, gen_s=gen_s, extra=extra)

    def learn(self, it: int, episodes: Sequence[Episode], *, gen_s: float,
              extra: dict[str, float] | None = None) -> dict[str, Any]:
        """values -> adv -> update_critic -> update_actor on iteration ``it``'s episodes (sampled in ``gen_s``;
        ``extra``: the collection's own metrics, logged with the rest); returns the iteration's metrics.

        With the critic's update beside the next sampling (:class:`CriticBeside`) the update starts after the
        actor's and the metrics get its figures, and are logged, when :meth:`finish_critic_update` joins it.
        """
        cfg, cur = self.cfg, self.cfg.curriculum
        policy, critic = self.policy, self.critic
        phase = self.phase_of(it)
        progress = it / max(1, self.rl_total)
        gamma, temp = cur.gamma.at(progress), cur.temperature.at(progress)
        eps, ent_coef = cur.epsilon.at(progress), cur.ent_coef.at(progress)
        timings: dict[str, float] = {"perf/gen_s": gen_s}
        self.critic_update.finish()  # the previous iteration's, when it ran beside this one's sampling
        released = release_host_memory()  # what the collection freed, before the update allocates
        torch.set_num_threads(cfg.run.train_threads)
        t = time.perf_counter()
        tt = turn_tensors(episodes)
        tt["rewards"] = tt["rewards"] * cfg.ppo.reward_scale
        full = make_token_batch([(i, s) for i, ep in enumerate(episodes) for s in ep.segments],
                                pad_id=policy.actor.pad_id, device=self.runtime.device)
        values, next_values = critic.values(episodes, full)
        timings["perf/values_s"] = time.perf_counter() - t

        t = time.perf_counter()
        adv, returns = critic.advantages(episodes, tt, values, next_values, gamma=gamma, lam=cfg.ppo.lam,
                                         reward_scale=cfg.ppo.reward_scale)
        if cfg.ppo.normalize_advantages:
            # Whiten as the token-level loss sees them: each turn counts once per action token.
            n_tok = torch.zeros_like(adv)
            for i, ep in enumerate(episodes):
                for j, turn in enumerate(ep.turns):
                    n_tok[i, j] = len(turn.action_ids)
            adv = normalize(adv, tt["mask"], weights=n_tok)
        timings["perf/adv_s"] = time.perf_counter() - t

        metrics: dict[str, Any] = {"phase": phase, "iter": it}
        beside = self.critic_update.beside
        # Beside, the update reads its own copies: the actor's update runs first on the same tensors.
        targets = (returns.clone(), values.clone()) if beside else (returns, values)
        update_critic = functools.partial(critic.update, episodes, *targets, gamma=gamma,
                                          reward_scale=cfg.ppo.reward_scale, with_actor=phase != "warmup")
        if not beside:
            metrics.update(timed_update(update_critic))

        t = time.perf_counter()
        if phase != "warmup":
            w_bc, w_rl = (cur.w_bc, cur.w_rl) if phase == "mixed" else (0.0, 1.0)
            metrics.update(self.algo.update(policy, episodes, adv, returns, values, tt["mask"], temperature=temp,
                                            ent_coef=ent_coef, w_bc=w_bc, w_rl=w_rl))
        timings["perf/update_actor_s"] = time.perf_counter() - t
        released += release_host_memory()
        rss = resident_bytes()
        if rss is not None:  # resident memory after the iteration, and what the C heap handed back (GB)
            timings["perf/rss_gb"], timings["perf/released_gb"] = rss / 2**30, released / 2**30

        if critic.has_values:
            metrics["losses/explained_variance"] = float(explained_variance(values, returns, tt["mask"]))
        metrics.update(summarize_episodes(episodes))
        metrics.update(timings)
        metrics.update(extra or {})
        metrics.update({
            **sampling_speed(episodes, timings["perf/gen_s"]),
            "schedule/gamma": gamma, "schedule/temperature": temp, "schedule/epsilon": eps,
            "schedule/ent_coef": ent_coef, "schedule/progress": progress,
            "guard/skipped_total": self.state.skipped,
        })

        def close(critic_metrics: dict[str, float]) -> None:
            metrics.update(critic_metrics)
            self.logger.log(self.state.bc_step + it, metrics)
            self.rep.metrics(phase, it, metrics)
            if cfg.run.diagnose_every and (it + 1) % cfg.run.diagnose_every == 0:
                self.health_check()

        self.critic_update.run(update_critic, close)
        return metrics

    def finish_critic_update(self) -> None:
        """Wait for the critic's update running beside sampling (if any), then log its iteration."""
        self.critic_update.finish()

    def health_check(self) -> list[str]:
        """The checks of ``polyturn diagnose`` on the log so far; each new warning goes to the reporter at once.

        Warnings already reported (kept in the checkpointed state) are not repeated. Returns the new messages.
        """
        new = []
        for w in check_all(read_records(self.logger.path), updates_per_iter=updates_per_iter(self.cfg)):
            if f"{w.kind}:{w.metric}" not in self.state.warned:
                self.state.warned.append(f"{w.kind}:{w.metric}")
                new.append(format_warning(w, plot_dir=self.out / "diagnose",
                                          drawn_by=f"polyturn diagnose --run {self.out} --episodes 0"))
                self.rep.message(new[-1])
        return new

    # ---- checkpoints ------------------------------------------------------------------
    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.policy.opt, **self.critic.optimizers()}

    def _rngs(self) -> dict[str, Any]:
        return {"np": self.rng, "torch_gen": self.gen, "py": self.py_rng}

    def save(self, name: str) -> Path:
        """Write a checkpoint directory and point ``latest`` at it (rank 0 only, under torchrun)."""
        self.critic_update.finish()
        if distributed.rank() != 0:
            return Path(self.cfg.run.out_dir) / name
        return ckpt.save(self.out / name, actor=self.actor, critic=self.critic, cfg=self.cfg,
                         state=self.state.to_json(), optimizers=self._optimizers(), rngs=self._rngs(),
                         run_dir=self.out, ref_actor=self.policy.ref_actor)

    def _restore(self, directory: Path) -> None:
        self.critic.load(directory)
        self.policy.opt = self.policy.make_optimizer()
        saved = RunState.from_json(ckpt.load_state(directory, optimizers=self._optimizers(), rngs=self._rngs()))
        for f in saved.__dataclass_fields__:  # in place: the policy and the task stream hold this object
            setattr(self.state, f, getattr(saved, f))
        self.policy.restore_reference(directory, bc_dir=Path(self.cfg.run.out_dir) / "ckpt-bc")
        self.logger.drop_from_iter(self.state.iter)
        self.rep.message(f"resumed from {directory} at RL iteration {self.state.iter}")
