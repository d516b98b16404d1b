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

The critic kind (polyturn.train.critics) and the policy update (polyturn.train.algorithms) are objects
behind interfaces: the loop never asks which it runs. Phase 1 lives in polyturn.train.bc_phase, the
shared minibatch loop of the actor step in polyturn.train.rl_update.

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
import functools
import gc
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from polyturn.acting.checkpoint import held_out_tasks, rollout_settings, run_actor
from polyturn.acting.episodes import SEARCH_FACTOR, GroupQuota, breakdown_of, task_group
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.algos.gae import normalize
from polyturn.algos.value import explained_variance
from polyturn.config import TrainConfig, save_config
from polyturn.health.signals import read_records
from polyturn.models.actor import Actor, load_actor
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import tokenize_demo
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime, machine, release_host_memory, resident_bytes
from polyturn.train import checkpoint as ckpt
from polyturn.train import distributed
from polyturn.train.action_learner import collect_branch_pairs
from polyturn.train.algorithms import PG_UPDATES, PolicyUpdate
from polyturn.train.batch import make_token_batch
from polyturn.train.bc_phase import BehaviourCloning
from polyturn.train.critics import turn_tensors
from polyturn.train.guard import guarded_step
from polyturn.train.logger import RunLogger
from polyturn.train.reporting import NullReporter, Reporter, summarize_episodes
from polyturn.train.rl_update import RLUpdates
from polyturn.train.setup import (
    build_actor,
    build_critic,
    first_rl_seed,
    load_or_make_demos,
    make_envs,
)
from polyturn.train.turn_dpo import TurnDPO

#: Every policy update by its ``ppo.algo`` name.
POLICY_UPDATES: dict[str, type[PolicyUpdate]] = {**PG_UPDATES, "turn_dpo": TurnDPO}

if TYPE_CHECKING:
    from polyturn.train.remote import RemoteCollection


def _timed_update(update: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run the critic's ``update``; its metrics and wall time."""
    t = time.perf_counter()
    metrics = update()
    return {**metrics, "perf/update_critic_s": time.perf_counter() - t}


class NonFiniteError(RuntimeError):
    """A loss or gradient was not finite and ``run.on_nonfinite`` is ``stop``."""


class Trainer(BehaviourCloning, RLUpdates):
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
        if distributed.setup(cfg.run.device) and (cfg.critic.target == "td" or cfg.rollout.workers
                                                  or cfg.critic.kind == "action" or cfg.ppo.algo == "turn_dpo"):
            raise ValueError("Expected one process per run with critic.target = td (one replay buffer), "
                             "rollout.workers > 0 (one learner), critic.kind = action or ppo.algo = turn_dpo (their "
                             f"updates are not sharded yet), got --nproc {distributed.world_size()}: use "
                             "critic.target=gae, rollout.workers=0 and a value critic or none with --nproc, or train "
                             "in one process")
        main_out = Path(cfg.run.out_dir)
        if resume and overwrite:
            raise ValueError("Expected --resume or --overwrite, got both: --resume continues the run in "
                             f"{main_out}, --overwrite starts it again")
        earlier = [] if resume else ckpt.earlier_run(main_out)
        if earlier and not overwrite:
            raise FileExistsError(
                f"run.out_dir {main_out} already holds a run ({', '.join(earlier)}): pass --resume to continue it, "
                "--overwrite to start it again (its metrics, evaluations and checkpoints are removed first), or "
                "set another run.out_dir")
        if earlier and distributed.rank() == 0:  # under torchrun rank 0 owns out_dir
            ckpt.clear_run(main_out, keep=Path(cfg.bc.demos) if cfg.bc.demos else None)
        distributed.barrier()
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
        if self.runtime.emulated_bf16:
            self.rep.message(f"run.precision = bf16 on a CPU that reports {torch.backends.cpu.get_cpu_capability()}, "
                             "without AVX-512: bf16 is emulated there, ~27x slower than fp32 (measured); "
                             "set run.precision: fp32 on this machine")
        self.py_rng = random.Random(cfg.run.seed)
        save_config(cfg, self.out / "config.yaml")

        if cfg.curriculum.group_shares:  # RL's task mix by group (checked before the demonstrations are made):
            self._task_group_of = breakdown_of(cfg.env.id, cfg.curriculum.balance_by)
            self._probe_env = make_envs(cfg, 1)[0]  # an env that only sets tasks to read their group
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
                                      "task_counter": first_rl_seed(cfg, self.demos)}
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
        self.algo = POLICY_UPDATES[cfg.ppo.algo](cfg.ppo)
        self.ref_actor: Actor | None = None
        self.logger = RunLogger(self.out, tensorboard=cfg.run.tensorboard)
        # The critic's update running beside the next iteration's sampling, and what completes its iteration.
        self._critic_pool: ThreadPoolExecutor | None = None
        self._critic_job: tuple[Future, Callable[[dict[str, float]], None]] | None = None
        if self.resume_from is not None:
            self._restore(self.resume_from)
        self.collector = Collector(self.actor, self.envs, env_id=cfg.env.id, settings=self.settings,
                                   env_threads=cfg.rollout.env_threads)
        # Best-of-n (rollout.best_of) collects training episodes only: held-out evaluation samples plainly, since
        # a critic that reads privileged text cannot act at deployment.
        self.train_collector = self.collector
        if cfg.rollout.best_of > 1:
            self.train_collector = Collector(self.actor, self.envs, env_id=cfg.env.id, settings=self.settings,
                                             env_threads=cfg.rollout.env_threads, best_of=cfg.rollout.best_of,
                                             scorer=lambda inputs: self.critic.score_candidates(inputs).tolist())
        # rollout.workers > 0: Ray actors collect the RL batches (polyturn.train.remote; started when RL starts,
        # with the weights it starts from); evaluation stays in this process.
        self.remote: RemoteCollection | None = None
        # BC reads each demonstration in the context a rollout of its task samples from: the same system
        # prompt (the tool docs of a task reset without options, as the demonstrations were played).
        system = tool_docs if self.settings.system_prompt else None
        demo_tokens = [tokenize_demo(self.actor, self.settings, rec, system=system) for rec in self.demos]
        self._demo_items = [d.segments for d in demo_tokens]
        self.demo_cut = self._check_cut_actions(demo_tokens)

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
        elif "bc" not in self.state["eval"] and self.cfg.run.eval_start:  # from actor.init_from: its policy
            with self._timed("eval_bc"):
                self.evaluate_all("bc")
        self._set_reference()
        self.rep.start("rl", self.rl_total - self.state["iter"])
        if self.state["iter"] < self.rl_total:
            # Resumed with more iterations than an earlier, finished run: its final evaluation is stale.
            for tag in ("final", "final_sampled"):
                self.state["eval"].pop(tag, None)
        try:
            self._rl_loop()
        finally:
            self._close_critic_pool()
        if self.remote is not None:
            self.remote.close()
        if "final" not in self.state["eval"]:
            with self._timed("eval_final"):
                if self.rl_total == 0 and "bc" in self.state["eval"]:  # no RL: the final policy is the one evaluated
                    self._copy_eval("bc", "final")
                else:
                    self.evaluate_all("final")
            self.save("ckpt-final")
        summary = {"eval": self.state["eval"], "wall_s": time.time() - t0, "skipped_updates": self.state["skipped"],
                   "phase_s": dict(self.state.get("phase_s", {})),
                   "machine": machine(self.runtime.device, rollout_threads=self.cfg.run.rollout_threads,
                                      train_threads=self.cfg.run.train_threads)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.logger.close()
        return summary

    def _rl_loop(self) -> None:
        # The setup's objects (models, tokenizers, the environments' data) live to the end: frozen, the garbage
        # collections of each iteration (release_host_memory's included) no longer walk them; measured on the demo,
        # that took release_host_memory from 0.56 s to 0.08 s an iteration.
        gc.collect()
        gc.freeze()
        try:
            # evaluate() and save() first join a critic update still running beside sampling.
            while self.state["iter"] < self.rl_total:
                with self._timed("rl"):
                    self.rl_iteration(self.state["iter"])
                self.state["iter"] += 1
                self.rep.advance(1)
                every = self.cfg.run.eval_every
                if every and self.state["iter"] % every == 0 and self.state["iter"] < self.rl_total:
                    tag = f"iter{self.state['iter']:04d}"
                    with self._timed("eval_curve"):
                        self.state["eval"][tag] = self.evaluate(tag, temperature=self.cfg.rollout.eval_temperature)
                if self.state["iter"] % self.cfg.run.checkpoint_every == 0 or self.state["iter"] == self.rl_total:
                    self.save(f"ckpt-iter{self.state['iter']:04d}")
        finally:
            gc.unfreeze()

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        """Add the block's wall seconds to ``state["phase_s"][phase]`` (kept in checkpoints, so a resumed run's
        summary.json counts the phases' time before the kill too; what a killed step had spent is lost)."""
        t = time.time()
        yield
        spent = self.state.setdefault("phase_s", {})
        spent[phase] = spent.get(phase, 0.0) + time.time() - t

    # ---- phases 2-4: RL ----------------------------------------------------------
    def next_tasks(self, n: int, progress: float) -> list[dict]:
        """Training tasks for one iteration, shaped by the curriculum stage."""
        cur = self.cfg.curriculum
        stage = cur.stage_at(progress)
        group = self.critic.task_group
        places = max(1, n // group)
        # curriculum.group_shares: seeds in order, each kept only while its group has room this iteration.
        quota = GroupQuota(places, cur.group_shares, label=str(cur.balance_by)) if cur.group_shares else None
        first, tasks = self.state["task_counter"], []
        while len(tasks) < places * group:
            if quota is not None and self.state["task_counter"] - first >= SEARCH_FACTOR * places:
                raise ValueError("curriculum.group_shares: " + quota.shortfall(
                    f"training seeds {first}..{self.state['task_counter'] - 1}"))
            seed = self.state["task_counter"]
            self.state["task_counter"] += 1
            opts: dict[str, Any] = {}
            if stage.levels:
                opts["level"] = int(self.rng.choice(stage.levels))
            if stage.max_turns:
                opts["max_turns"] = stage.max_turns
            if stage.tools:
                opts["tools"] = list(stage.tools)
            if quota is not None and not quota.take(task_group(self._probe_env, self._task_group_of, seed=seed,
                                                               options=opts)):
                continue
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
        episodes = self.train_collector.collect(distributed.shard(tasks), temperature=cur.temperature.at(progress),
                                                epsilon=cur.epsilon.at(progress), rng=rng, generator=self.gen)
        episodes = distributed.gather_in_order(episodes)
        gen_s, extra = time.perf_counter() - t, {}
        if cfg.critic.branch_states:
            t = time.perf_counter()
            self.critic.turn_pairs, extra = collect_branch_pairs(
                self.train_collector, tasks, episodes, states=cfg.critic.branch_states, k=cfg.critic.branch_candidates,
                rng=self.py_rng, temperature=cur.temperature.at(progress), generator=self.gen)
            extra["perf/branch_gen_s"] = time.perf_counter() - t
        return self.learn(it, episodes, gen_s=gen_s, extra=extra)

    def learn(self, it: int, episodes: Sequence[Episode], *, gen_s: float,
              extra: dict[str, float] | None = None) -> dict[str, Any]:
        """values -> adv -> update_critic -> update_actor on iteration ``it``'s episodes (sampled in ``gen_s``;
        ``extra``: the collection's own metrics, logged with the rest); returns the iteration's metrics.

        With the critic's update beside the next sampling (:meth:`_critic_beside`) the update starts after the
        actor's and the metrics get its figures, and are logged, when :meth:`finish_critic_update` joins it.
        """
        cfg, cur = self.cfg, self.cfg.curriculum
        phase = self.phase_of(it)
        progress = it / max(1, self.rl_total)
        gamma, temp = cur.gamma.at(progress), cur.temperature.at(progress)
        eps, ent_coef = cur.epsilon.at(progress), cur.ent_coef.at(progress)
        timings: dict[str, float] = {"perf/gen_s": gen_s}
        self.finish_critic_update()  # the previous iteration's, when it ran beside this one's sampling
        released = release_host_memory()  # what the collection freed, before the update allocates
        torch.set_num_threads(cfg.run.train_threads)
        t = time.perf_counter()
        tt = turn_tensors(episodes)
        tt["rewards"] = tt["rewards"] * cfg.ppo.reward_scale
        full = make_token_batch([(i, s) for i, ep in enumerate(episodes) for s in ep.segments],
                                pad_id=self.actor.pad_id, device=self.runtime.device)
        values, next_values = self.critic.values(episodes, full)
        timings["perf/values_s"] = time.perf_counter() - t

        t = time.perf_counter()
        adv, returns = self.critic.advantages(episodes, tt, values, next_values, gamma=gamma, lam=cfg.ppo.lam,
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
        beside = self._critic_beside()
        # Beside, the update reads its own copies: the actor's update runs first on the same tensors.
        targets = (returns.clone(), values.clone()) if beside else (returns, values)
        update_critic = functools.partial(self.critic.update, episodes, *targets, gamma=gamma,
                                          reward_scale=cfg.ppo.reward_scale, with_actor=phase != "warmup")
        if not beside:
            metrics.update(_timed_update(update_critic))

        t = time.perf_counter()
        if phase != "warmup":
            w_bc, w_rl = (cur.w_bc, cur.w_rl) if phase == "mixed" else (0.0, 1.0)
            metrics.update(self.algo.update(self, episodes, adv, returns, values, tt["mask"], temperature=temp,
                                            ent_coef=ent_coef, w_bc=w_bc, w_rl=w_rl))
        timings["perf/update_actor_s"] = time.perf_counter() - t
        released += release_host_memory()
        rss = resident_bytes()
        if rss is not None:  # resident memory after the iteration, and what the C heap handed back (GB)
            timings["perf/rss_gb"], timings["perf/released_gb"] = rss / 2**30, released / 2**30

        n_turns = sum(len(ep.turns) for ep in episodes)
        n_tokens = sum(len(tr.action_ids) for ep in episodes for tr in ep.turns)
        if self.critic.has_values:
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

        def close(critic_metrics: dict[str, float]) -> None:
            metrics.update(critic_metrics)
            self.logger.log(self.state["bc_step"] + it, metrics)
            self.rep.metrics(phase, it, metrics)
            if cfg.run.diagnose_every and (it + 1) % cfg.run.diagnose_every == 0:
                self.health_check()

        if beside:
            if self._critic_pool is None:
                self._critic_pool = ThreadPoolExecutor(1, thread_name_prefix="polyturn-critic")
            # torch's thread count is the process's, not a thread's: the update and the sampling beside it each run
            # with rollout_threads (set here, before either starts, so neither changes it under the other).
            torch.set_num_threads(cfg.run.rollout_threads)
            self._critic_job = (self._critic_pool.submit(_timed_update, update_critic), close)
        else:
            close({})
        return metrics

    def _critic_beside(self) -> bool:
        """Whether the critic's update runs beside the next iteration's sampling (else in line, before the actor's).

        Only where that changes nothing but the time and the thread count: a critic whose update never reads the
        actor (``update_apart``), on the CPU, in one process that samples itself, and with the cores for both
        (``run.train_threads`` at least twice ``run.rollout_threads``; each side gets ``rollout_threads``).
        """
        run = self.cfg.run
        return (run.critic_beside and self.critic.update_apart and self.runtime.device.type == "cpu"
                and not distributed.active() and not self.cfg.rollout.workers
                and run.train_threads >= 2 * run.rollout_threads)

    def finish_critic_update(self) -> None:
        """Wait for the critic's update running beside sampling (if any), then log its iteration.

        Everything that reads the critic or the finished iteration calls this first: the next values, evaluations,
        checkpoints and the end of the run. The update's own errors are raised here.
        """
        if self._critic_job is None:
            return
        job, close = self._critic_job
        self._critic_job = None
        t = time.perf_counter()
        critic_metrics = job.result()
        close({**critic_metrics, "perf/critic_wait_s": time.perf_counter() - t})

    def _close_critic_pool(self) -> None:
        """Let a running update end (an error in the loop leaves the critic consistent), then stop its thread."""
        if self._critic_pool is not None:
            self._critic_pool.shutdown(wait=True)
            self._critic_pool = None
        self._critic_job = None

    def health_check(self) -> list[str]:
        """The checks of ``polyturn diagnose`` on the log so far; each new warning goes to the reporter at once.

        Warnings already reported (kept in the checkpointed state) are not repeated. Returns the new messages.
        """
        from polyturn.health.checks import check_all, format_warning, updates_per_iter

        warned = self.state.setdefault("warned", [])
        new = []
        for w in check_all(read_records(self.logger.path), updates_per_iter=updates_per_iter(self.cfg)):
            if f"{w.kind}:{w.metric}" not in warned:
                warned.append(f"{w.kind}:{w.metric}")
                new.append(format_warning(w, plot_dir=self.out / "diagnose",
                                          drawn_by=f"polyturn diagnose --run {self.out} --episodes 0"))
                self.rep.message(new[-1])
        return new

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

    def _copy_eval(self, src: str, dst: str) -> None:
        """Record held-out evaluation ``src`` (and its sampled twin) again as ``dst``, episodes relabelled: for a
        policy that has not changed since ``src`` (a run without RL iterations), instead of sampling it again."""
        for suffix in ("", "_sampled"):
            if f"{src}{suffix}" not in self.state["eval"]:
                continue
            records = read_jsonl(self.out / f"eval_{src}{suffix}.jsonl")
            write_jsonl(self.out / f"eval_{dst}{suffix}.jsonl", [{**r, "policy": f"{dst}{suffix}"} for r in records])
            self.state["eval"][f"{dst}{suffix}"] = res = dict(self.state["eval"][f"{src}{suffix}"])
            self._log_eval(f"{dst}{suffix}", res)

    def _log_eval(self, tag: str, res: dict[str, float]) -> None:
        """Write evaluation ``tag``'s results to the run's metrics log."""
        self.logger.log(self.state["bc_step"] + self.state["iter"], {"phase": f"eval_{tag}",
                                                                      **{f"eval/{k}": v for k, v in res.items()}})

    def evaluate(self, tag: str, *, temperature: float) -> dict[str, float]:
        """Success on held-out task seeds (never trained on)."""
        self.finish_critic_update()  # the metrics log stays in order
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
        del episodes
        release_host_memory()
        self._log_eval(tag, res)
        self.rep.metrics(f"eval_{tag}", self.state["iter"], {f"eval/{k}": v for k, v in res.items()})
        return res

    def save(self, name: str) -> Path:
        """Write a checkpoint directory and point ``latest`` at it (rank 0 only, under torchrun)."""
        self.finish_critic_update()
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
