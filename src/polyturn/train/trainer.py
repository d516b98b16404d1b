"""The training loop: BC -> critic warm-up -> mixed BC+RL -> PPO, read top to bottom.

One RL iteration, with its stages named and timed as verl does::

    gen            collect episodes with the current policy (batched, many envs)
    values         critic values V(s_t) per turn (+ V(s_T) where the episode end bootstraps: critics.bootstraps)
    adv            the critic's advantages: turn-level GAE, the group-relative baseline (critic.kind none),
                   or the action critic's turn scores; with constraints, less lambda x the cost critics' advantages
    update_critic  the critic's own optimizer (skipped for none; folded into the actor for shared); a
                   critic whose update never reads the actor (``CriticLearner.update_apart``) trains on
                   the cores sampling leaves idle, beside the next iteration's gen (``run.critic_beside``)
    update_actor   the ppo.algo's update (polyturn.train.algorithms): token-level PPO-clip on action
                   tokens, rft's NLL of the successful episodes' actions, turn-level DPO, ...
                   (+ w_bc * BC in the mixed phase)

The run holds a :class:`~polyturn.train.policy.Policy` per role (its actor, optimizer, reference, guarded step and
BC loss) with its critic learner (:mod:`polyturn.train.critics`, one class per kind from a registry) and policy
update (:mod:`polyturn.train.algorithms`): the loop never asks which critic or update it runs. Phase 1 lives in
:mod:`polyturn.train.bc_phase` (offline RL, which replaces or follows it: :mod:`polyturn.train.offline`), held-out
evaluation in :mod:`polyturn.train.evaluation`. The simplifications it makes are listed, as nanochat's RL script
lists its own, in :mod:`polyturn.train.policy`.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polyturn.acting.checkpoint import rollout_settings
from polyturn.acting.hierarchy import role_demos
from polyturn.config import TrainConfig, save_config
from polyturn.models.actor import Actor
from polyturn.rollout.context import tokenize_demo
from polyturn.rollout.multi import MultiAgentCollector
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime, long_lived_frozen, machine, release_host_memory
from polyturn.train import checkpoint as ckpt, distributed
from polyturn.train.bc_phase import behaviour_cloning, check_cut_actions
from polyturn.train.constraints import Constraints, candidate_scorer
from polyturn.train.critic_beside import CriticBeside
from polyturn.train.critics import build_critic
from polyturn.train.evaluation import HeldOut, play_alone
from polyturn.train.hierarchy import HierarchyPlay
from polyturn.train.judge_term import JudgeTerm
from polyturn.train.logger import RunLogger
from polyturn.train.offline import OfflinePhase
from polyturn.train.policy import NonFiniteError, Policy
from polyturn.train.refusals import DemoStarts, start_metrics
from polyturn.train.remote import RemoteCollection
from polyturn.train.reporting import NullReporter, Reporter, iteration_metrics, report_new_warnings
from polyturn.train.selfplay import SelfPlay, make_selfplay, role_policies
from polyturn.train.setup import (env_outline, first_rl_seed, initial_actor, load_or_make_demos, make_collectors,
                                  make_envs, vllm_engine)
from polyturn.train.state import AGENT, RunState
from polyturn.train.tasks import TaskStream
from polyturn.train.updates import POLICY_UPDATES, check_run

__all__ = ["POLICY_UPDATES", "NonFiniteError", "Trainer", "check_run"]


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
        self.offline = OfflinePhase.load(cfg, rep=self.rep) if cfg.offline else None  # its data summary first
        self.out, self.resume_from = ckpt.open_run(Path(cfg.run.out_dir), resume=resume, overwrite=overwrite,
                                                   keep=Path(cfg.bc.demos) if cfg.bc.demos else None)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)
        self.rng = np.random.default_rng(cfg.run.seed)
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
        #: The roles of a multi-role environment (self-play); ``(agent,)`` for a single-agent one.
        self.roles, self.feature_names, tool_docs = env_outline(self.envs[0], seed=cfg.env.train_seed_start)
        self.settings = rollout_settings(cfg)

        actor, given = initial_actor(cfg, self.demos, tool_docs, resume_from=self.resume_from)
        if given:  # the given actor replaces BC (an offline phase still runs)
            self.state.phase = "offline" if self.offline else "rl"
        actor.to(self.runtime)
        if cfg.actor.gradient_checkpointing:
            actor.enable_gradient_checkpointing()
        critic = build_critic(cfg, self.demos, actor, self.feature_names)
        critic.to(self.runtime)
        # BC reads each demonstration in the context its task's rollouts sample from (the same system prompt).
        self.system = tool_docs if self.settings.system_prompt else None
        demo_tokens = [tokenize_demo(actor, self.settings, rec, system=self.system)
                       for rec in role_demos(self.demos, self.roles[0])]
        self.demo_cut = check_cut_actions(demo_tokens, cap=cfg.rollout.max_action_tokens, rep=self.rep)
        per_role = self.multi and (cfg.selfplay.weights == "per_role" or cfg.hierarchy is not None)
        self.policy = Policy(name=self.roles[0] if per_role else AGENT, actor=actor, critic=critic,
                             demos=[d.segments for d in demo_tokens], cfg=cfg.manager_config(),
                             runtime=self.runtime, state=self.state,
                             settings=self.settings, py_rng=self.py_rng, gen=self.gen, on_message=self.rep.message,
                             constraints=Constraints.build(cfg, demos=self.demos, actor=actor, state=self.state,
                                                           feature_names=self.feature_names, runtime=self.runtime))
        #: The run's policies by name: one (``agent``), or one per role (named by it) with selfplay.weights: per_role.
        self.policies: dict[str, Policy] = {self.policy.name: self.policy}
        if per_role:  # a hierarchy's worker BCs on its own demonstrations, in its own context
            self.policies |= role_policies(self.policy, self.roles[1:], demos=self.demos,
                                           feature_names=self.feature_names, resume_from=self.resume_from,
                                           system=self.envs[0].tool_docs if cfg.hierarchy else None, cfg=cfg)
        #: Each policy's update (a hierarchy's manager may carry its own ppo.kl_coef: hierarchy.manager_kl).
        self.algos = {n: POLICY_UPDATES[p.cfg.ppo.algo](p.cfg.ppo) for n, p in self.policies.items()}
        self.logger = RunLogger(self.out, tensorboard=cfg.run.tensorboard)
        self.critic_update = CriticBeside(cfg, critic, self.runtime, alone=len(self.policies) == 1)
        self.judge = JudgeTerm(cfg.judge, out_dir=self.out) if cfg.judge else None  # the term judge/score
        if self.resume_from is not None:
            self._restore(self.resume_from)
        self.selfplay: SelfPlay | HierarchyPlay | None = None  # the multi-role play: self-play or a hierarchy
        self.vllm = None if self.multi else vllm_engine(cfg, actor, self.out, self.rep.message)  # rollout.engine
        if self.multi:
            self.collector = self.train_collector = MultiAgentCollector(self.envs, env_id=cfg.env.id,
                                                                        settings=self.settings)
            self.selfplay = HierarchyPlay(cfg, policies=self.policies, out=self.out) if cfg.hierarchy else make_selfplay(
                cfg, roles=self.roles, policies=self.policies, out=self.out, state=self.state, runtime=self.runtime)
        else:  # best-of-n (rollout.best_of) collects training episodes only: see make_collectors
            scorer = candidate_scorer(cfg, critic, self.policy.constraints)  # the action critic's, or by cost
            self.collector, self.train_collector = make_collectors(cfg, actor, self.envs, self.settings, scorer=scorer,
                                                                   vllm=self.vllm)
        play = (functools.partial(self.selfplay.held_out, self.collector) if self.selfplay is not None
                else functools.partial(play_alone, self.collector, seed=cfg.run.seed))
        self.held_out = HeldOut(cfg=cfg, actor=actor, play=play, out=self.out, logger=self.logger, rep=self.rep,
                                state=self.state, before=self.critic_update.finish)
        self.refusal_starts = DemoStarts(cfg, self.demos, self.envs[0], actor=actor, settings=self.settings,
                                         multi=self.multi)  # ppo.refusal_pairs.demo_starts
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

    @property
    def algo(self):  # noqa: ANN201 - a PolicyUpdate
        return self.algos[self.policy.name]

    @property
    def multi(self) -> bool:
        """Whether the environment has several roles (self-play)."""
        return self.roles != (AGENT,)

    # ---- phases ---------------------------------------------------------------
    @property
    def rl_total(self) -> int:
        c = self.cfg.curriculum
        return c.warmup_iters + c.mixed_iters + c.ppo_iters

    def phase_of(self, it: int) -> str:
        c = self.cfg.curriculum
        return "warmup" if it < c.warmup_iters else "mixed" if it < c.warmup_iters + c.mixed_iters else "ppo"

    def run(self) -> dict[str, Any]:
        """Run every remaining phase; returns the summary (also written to ``summary.json``)."""
        with long_lived_frozen():  # the setup's objects live to the end: no collection walks them
            return self._run()

    def _run(self) -> dict[str, Any]:
        t0 = time.time()
        st = self.state
        if st.pending_eval:  # resumed after a phase ended, before its evaluation did
            self._evaluate_phase()
        if st.phase == "bc" and (self.offline is None or self.cfg.offline.after_bc):
            with st.timed("bc"):  # each policy on its own demonstrations (the main one only, in self-play)
                for p in self.policies.values() if self.cfg.hierarchy else [self.policy]:
                    st.bc_step += behaviour_cloning(p, logger=self.logger, rep=self.rep, extra=self.demo_cut,
                                                    first_step=st.bc_step, label=p.name if p is not self.policy else "")
            self._phase_one_done("bc", then="rl" if self.offline is None else "offline")
        elif st.phase != "bc" and not {"bc", "offline"} & set(st.eval) and self.cfg.run.eval_start:  # actor.init_from
            with st.timed("eval_bc"):
                self.held_out.all("bc")
        if self.offline is not None and st.phase != "rl":  # offline RL: replaces BC, or follows it
            with st.timed("offline"):
                st.bc_step = self.offline.run(self, first_step=st.bc_step)
            self._phase_one_done("offline", then="rl")
        for p in self.policies.values():
            p.set_reference()
        if self.selfplay is not None and not st.pool:  # the pool starts with the policy RL starts from
            self.selfplay.snapshot(st.iter, self._actors())
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
                start = "offline" if "offline" in st.eval else "bc"
                if self.rl_total == 0 and start in st.eval:  # no RL: the final policy is the one evaluated
                    self.held_out.copy(start, "final")
                else:
                    self.held_out.all("final")
            self.save("ckpt-final")
        summary = {"eval": st.eval, "wall_s": time.time() - t0, "skipped_updates": st.skipped,
                   "phase_s": dict(st.phase_s),
                   "machine": machine(self.runtime.device, rollout_threads=self.cfg.run.rollout_threads,
                                      train_threads=self.cfg.run.train_threads)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.logger.close()
        self.close_envs()
        return summary

    def _phase_one_done(self, tag: str, *, then: str) -> None:
        """Go on from phase ``tag`` (bc, offline) to ``then`` (rl: the reference is set), and evaluate what it left.
        ckpt-<tag> is written before the evaluation too (the hierarchical SmolLM2 run's takes over an hour): a run
        killed during it resumes at the evaluation."""
        self.state.phase = then
        if then == "rl":
            for p in self.policies.values():
                p.set_reference()
        self.state.pending_eval = tag
        self.save(f"ckpt-{tag}")
        self._evaluate_phase()

    def _evaluate_phase(self) -> None:
        """The held-out evaluation of the phase that ended (``state.pending_eval``), then ckpt-<phase> with it."""
        tag = self.state.pending_eval
        with self.state.timed(f"eval_{tag}"):
            self.held_out.all(tag)
        self.state.pending_eval = ""
        self.save(f"ckpt-{tag}")

    def close_envs(self) -> None:
        """Close the run's environments (an SQL env removes its plot folder), the task stream's probe included."""
        for closable in [*self.envs, self.task_stream, *([self.vllm] if self.vllm is not None else [])]:
            closable.close()

    def _rl_loop(self) -> None:
        # What BC and the evaluations kept (the reference policy, ...) lives to the end too: frozen, the garbage
        # collections of each iteration (release_host_memory's included) no longer walk it; measured on the demo,
        # freezing the setup took release_host_memory from 0.56 s to 0.08 s an iteration.
        st = self.state
        with long_lived_frozen():
            # Evaluations and save() first join a critic update still running beside sampling.
            while st.iter < self.rl_total:
                with st.timed("rl"):
                    self.rl_iteration(st.iter)
                st.iter += 1
                self.rep.advance(1)
                if self.selfplay is not None and st.iter % self.cfg.selfplay.snapshot_every == 0:
                    self.selfplay.snapshot(st.iter, self._actors())
                every = self.cfg.run.eval_every
                if every and st.iter % every == 0 and st.iter < self.rl_total:
                    tag = f"iter{st.iter:04d}"
                    with st.timed("eval_curve"):
                        st.eval[tag] = self.held_out.run(tag, temperature=self.cfg.rollout.eval_temperature)
                if st.iter % self.cfg.run.checkpoint_every == 0 or st.iter == self.rl_total:
                    self.save(f"ckpt-iter{st.iter:04d}")

    # ---- phases 2-4: RL ----------------------------------------------------------
    def next_tasks(self, n: int, progress: float) -> list[dict]:
        """Training tasks for one iteration, shaped by the curriculum stage (and :class:`DemoStarts`)."""
        group = self.critic.task_group
        return self.refusal_starts.apply(self.task_stream.next(n, progress, group=group), group=group,
                                         rng=self.py_rng)

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
        for p in self.policies.values():
            p.actor.model.eval()
        tasks = self.next_tasks(cfg.ppo.episodes_per_iter, progress)
        if self.selfplay is not None:  # seat each game, play them, and hand each policy the seats it played
            games, extra = self.selfplay.games(tasks, it, group=self.critic.task_group)
            played = self.collector.collect(games, temperature=cur.temperature.at(progress),
                                            epsilon=cur.epsilon.at(progress), rng=self.rng, generator=self.gen,
                                            progress=self.rep.sub("sampling", len(games)))
            batches, seated = self.selfplay.batches(played)
            return self.learn(it, batches, gen_s=time.perf_counter() - t, extra={**extra, **seated})
        # Under torchrun each process plays its share of the tasks (its own exploration draws, so the shared
        # task stream stays the same on every rank) and then every process holds the whole batch, in task order.
        rng = np.random.default_rng([cfg.run.seed, it, distributed.rank()]) if distributed.active() else self.rng
        mine = distributed.shard(tasks)
        episodes = self.train_collector.collect(mine, temperature=cur.temperature.at(progress),
                                                epsilon=cur.epsilon.at(progress), rng=rng, generator=self.gen,
                                                progress=self.rep.sub("sampling", len(mine)))
        episodes = distributed.gather_in_order(episodes)
        gen_s = time.perf_counter() - t
        extra = self.critic.collect_extra(self.train_collector, tasks, episodes, rng=self.py_rng,
                                          temperature=cur.temperature.at(progress), generator=self.gen)
        extra = {**extra, **start_metrics(tasks, episodes)}
        return self.learn(it, episodes, gen_s=gen_s, extra=extra)

    def learn(self, it: int, episodes: Sequence[Episode] | dict[str, Sequence[Episode]], *, gen_s: float,
              extra: dict[str, float] | None = None) -> dict[str, Any]:
        """(judge ->) values -> adv -> update_critic -> update_actor on iteration ``it``'s episodes (sampled in
        ``gen_s``; ``extra``: the collection's metrics, logged with the rest); returns the iteration's metrics.

        ``episodes``: the one policy's, or each policy's by name (self-play; a policy's metrics are then logged under
        ``<name>/`` when there are several). With the critic's update beside the next sampling
        (:class:`CriticBeside`) the update starts after the actor's and the metrics get its figures, and are
        logged, when ``self.critic_update.finish()`` joins it.
        """
        cfg, cur = self.cfg, self.cfg.curriculum
        batches = episodes if isinstance(episodes, dict) else {self.policy.name: episodes}
        judged = (self.judge.apply([ep for b in batches.values() for ep in b], warned=self.state.warned)
                  if self.judge else {})
        phase = self.phase_of(it)
        progress = it / max(1, self.rl_total)
        gamma, temp = cur.gamma.at(progress), cur.temperature.at(progress)
        eps, ent_coef = cur.epsilon.at(progress), cur.ent_coef.at(progress)
        timings: dict[str, float] = {"perf/gen_s": gen_s}
        self.critic_update.finish()  # the previous iteration's, when it ran beside this one's sampling
        released = release_host_memory()  # what the collection freed, before the update allocates
        torch.set_num_threads(cfg.run.train_threads)
        metrics: dict[str, Any] = {"phase": phase, "iter": it}
        update_critic = None
        for name, batch in batches.items():
            if not batch:
                continue
            steps = self.rep.sub if len(batches) == 1 else functools.partial(_named_sub, self.rep, name)
            m, update_critic = self.policies[name].learn(self.algos[name], batch, phase=phase, gamma=gamma, temp=temp,
                                                         ent_coef=ent_coef, beside=self.critic_update.beside,
                                                         timings=timings, progress=steps)
            metrics.update(m if len(batches) == 1 else {f"{name}/{k}": v for k, v in m.items()})
        released += release_host_memory()
        metrics.update(iteration_metrics(
            [ep for batch in batches.values() for ep in batch], timings, extra={**(extra or {}), **judged},
            released=released, schedule={"gamma": gamma, "temperature": temp, "epsilon": eps, "ent_coef": ent_coef,
                                         "progress": progress}, skipped=self.state.skipped))

        def close(critic_metrics: dict[str, float]) -> None:
            metrics.update(critic_metrics)
            self.logger.log(self.state.bc_step + it, metrics)
            self.rep.metrics(phase, it, metrics)
            if cfg.run.diagnose_every and (it + 1) % cfg.run.diagnose_every == 0:
                report_new_warnings(cfg, self.logger.path, seen=self.state.warned, out=self.out, rep=self.rep)

        self.critic_update.run(update_critic, close)
        return metrics

    # ---- checkpoints ------------------------------------------------------------------
    def _actors(self) -> dict[str, Actor]:
        return {name: p.actor for name, p in self.policies.items()}

    def _rngs(self) -> dict[str, Any]:
        return {"np": self.rng, "torch_gen": self.gen, "py": self.py_rng}

    def save(self, name: str) -> Path:
        """Write a checkpoint directory and point ``latest`` at it (rank 0 only, under torchrun)."""
        self.critic_update.finish()
        if distributed.rank() != 0:
            return Path(self.cfg.run.out_dir) / name
        policies = list(self.policies.values())
        return ckpt.save(self.out / name, actor=self.actor, critic=self.critic, cfg=self.cfg,
                         state=self.state.to_json(), optimizers=ckpt.policy_optimizers(policies), rngs=self._rngs(),
                         run_dir=self.out, ref_actor=self.policy.ref_actor,
                         extra=functools.partial(ckpt.save_parts, policies))

    def _restore(self, directory: Path) -> None:
        policies = list(self.policies.values())
        for p in policies:
            p.restore(ckpt.role_dir(directory, p, main=p is self.policy))
        saved = RunState.from_json(ckpt.load_state(directory, optimizers=ckpt.policy_optimizers(policies),
                                                   rngs=self._rngs()))
        for f in saved.__dataclass_fields__:  # in place: the policies and the task stream hold this object
            setattr(self.state, f, getattr(saved, f))
        bc_dir = Path(self.cfg.run.out_dir) / "ckpt-bc"
        for p in policies:
            main = p is self.policy
            p.restore_reference(ckpt.role_dir(directory, p, main=main), bc_dir=ckpt.role_dir(bc_dir, p, main=main))
        pending = self.state.pending_eval
        self.logger.drop_from_iter(self.state.iter, evals=(pending, f"{pending}_sampled") if pending else ())
        where = f"the {pending} evaluation" if pending else f"RL iteration {self.state.iter}"
        self.rep.message(f"resumed from {directory} at {where}")


def _named_sub(rep: Reporter, policy: str, step: str, total: int) -> Callable[[int], None]:
    """``rep.sub`` with the policy's name before the step's (``manager update``), when a run has several."""
    return rep.sub(f"{policy} {step}", total)
