"""Self-play on a multi-role environment: who sits where in each game, the opponent pool, and what each policy
learns from.

Each RL iteration's task groups (``critic.task_group`` attempts at one seed) draw their partner kind from
``selfplay.mix`` and their learner's role uniformly:

* ``latest``: every seat is a learning policy (with ``selfplay.weights: shared`` the one policy plays both
  sides, and both sides' episodes are trained on);
* ``pool``: the learner's role is the learning policy, the others a frozen earlier checkpoint from the pool;
* ``scripted``: the others are the env's scripted training partners (its spec's ``partners``).

A policy trains only on the episodes of the seats it played itself (the turns it wrote: a role's episode holds
only that role's tokens, so each loss is role-masked by construction). Baselines are per role: the group-relative
baseline and the action critic's pairs compare attempts at one task in one role (critics.task_groups).

The pool snapshots the learning policies when RL starts and every ``selfplay.snapshot_every`` iterations,
drawing from the last ``selfplay.pool_size`` (``<run>/pool/iter<NNNN>/<policy>/``, HF directories; the run state
lists them, so resume draws from the same pool). Partner draws come from a generator seeded by the run seed and the
iteration, so a resumed run draws what the uninterrupted one would.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from polyturn.acting.hierarchy import role_demos
from polyturn.acting.seats import play_seated, seated_games, training_partners
from polyturn.config import TrainConfig
from polyturn.models.actor import Actor, load_actor
from polyturn.rollout.context import tokenize_demo
from polyturn.rollout.multi import MultiAgentCollector, Player, Seat
from polyturn.rollout.types import Episode
from polyturn.runtime import Runtime
from polyturn.train import distributed
from polyturn.train.critics import build_critic
from polyturn.train.policy import Policy
from polyturn.train.state import RunState

KINDS = ("latest", "pool", "scripted")


class OpponentPool:
    """Earlier checkpoints of the learning policies, kept on disk and loaded (frozen) when drawn."""

    def __init__(self, out: Path, state: RunState, *, size: int, runtime: Runtime) -> None:
        self.dir, self.state, self.size, self.runtime = out / "pool", state, size, runtime
        self._loaded: dict[str, Actor] = {}

    def snapshot(self, it: int, actors: dict[str, Actor]) -> None:
        """Save ``actors`` (policy name -> actor) as pool entry ``iter<it>``; the oldest entry beyond the pool's
        size leaves the pool. Its directory stays: a run resumed from an earlier checkpoint draws from that
        checkpoint's pool, which may still hold it."""
        entry = f"iter{it:04d}"
        for name, actor in actors.items():
            actor.save_pretrained(self.dir / entry / name)
        if entry not in self.state.pool:
            self.state.pool.append(entry)
        while len(self.state.pool) > self.size:
            old = self.state.pool.pop(0)
            self._loaded = {k: v for k, v in self._loaded.items() if not k.startswith(f"{old}/")}

    def actor(self, entry: str, name: str) -> Actor:
        """Policy ``name`` of pool entry ``entry``, in eval mode on the run's device (loaded once)."""
        key = f"{entry}/{name}"
        if key not in self._loaded:
            path = self.dir / entry / name
            if not path.is_dir():
                raise FileNotFoundError(f"Expected the opponent pool's {key} in {path} (selfplay pool entry "
                                        "listed in the run state), found none: was the run directory moved?")
            actor = load_actor(path).to(self.runtime)
            actor.model.requires_grad_(False).eval()
            self._loaded[key] = actor
        return self._loaded[key]


class SelfPlay:
    """The seats of each training game and the batches each policy learns from (see the module docstring)."""

    def __init__(self, *, roles: Sequence[str], policies: dict[str, Policy], pool: OpponentPool,
                 partners: dict[str, Callable[[], Player]], mix: dict[str, float], seed: int) -> None:
        self.roles = tuple(roles)
        self.policies = policies
        self.pool = pool
        self.partners = partners
        self.mix = mix
        self.seed = seed
        if mix["scripted"] > 0 and not partners:
            raise ValueError("Expected scripted training partners for selfplay.mix.scripted > 0, got none: the env "
                             "spec names no partners (or selfplay.scripted names none of them); set "
                             "selfplay.mix.scripted=0")

    def held_out(self, collector: MultiAgentCollector, tasks: Sequence[dict], *, temperature: float, label: str,
                 progress: Callable[[int], None] | None = None) -> list[Episode]:
        """The learning policies' episodes on held-out ``tasks``, each seated in each role in turn against the
        scripted training partners (:func:`polyturn.acting.seats.seated_games`)."""
        actors = {r: self.learner(r).actor for r in self.roles}
        games, roles = seated_games(tasks, self.roles, actors=actors, label=label, partners=self.partners)
        return play_seated(collector, games, roles, temperature=temperature, seed=self.seed, progress=progress)

    def snapshot(self, it: int, actors: dict[str, Actor]) -> None:
        """Put the learning policies into the opponent pool as entry ``iter<it>``."""
        self.pool.snapshot(it, actors)

    def learner(self, role: str) -> Policy:
        """The learning policy that plays ``role`` (the one policy, with shared weights)."""
        return self.policies[role] if role in self.policies else next(iter(self.policies.values()))

    def _seat(self, role: str) -> Seat:
        p = self.learner(role)
        return Seat(p.name, actor=p.actor)

    def games(self, tasks: Sequence[dict], it: int, *, group: int) -> tuple[list[dict], dict[str, float]]:
        """Seat every task (``group`` consecutive tasks share their draw: one partner, one learner role)."""
        rng = np.random.default_rng([self.seed, 7919, it])
        kinds, probs = list(KINDS), [self.mix[k] for k in KINDS]
        counts = dict.fromkeys(KINDS, 0)
        games = []
        for start in range(0, len(tasks), group):
            kind = str(rng.choice(kinds, p=probs))
            if kind == "pool" and not self.pool.state.pool:
                kind = "latest"  # nothing in the pool yet
            learner_role = self.roles[int(rng.integers(len(self.roles)))]
            if kind == "latest":
                seats = {r: self._seat(r) for r in self.roles}
            elif kind == "pool":
                entry = self.pool.state.pool[int(rng.integers(len(self.pool.state.pool)))]
                seats = {r: self._seat(r) if r == learner_role
                         else Seat(f"pool:{entry}", actor=self.pool.actor(entry, self.learner(r).name))
                         for r in self.roles}
            else:
                names = sorted(self.partners)
                name = names[int(rng.integers(len(names)))]
                seats = {r: self._seat(r) if r == learner_role else Seat(f"scripted:{name}", player=self.partners[name])
                         for r in self.roles}
            counts[kind] += 1
            games += [{**t, "seats": seats} for t in tasks[start : start + group]]
        n = max(1, sum(counts.values()))
        return games, {f"selfplay/games_{k}": v / n for k, v in counts.items()}

    def batches(self, played: Sequence[dict[str, Episode]]) -> tuple[dict[str, list[Episode]], dict[str, float]]:
        """Each policy's training episodes (the seats it played, with at least one turn) and per-role metrics of
        them: success, return, and how often a learner out-earned its partner."""
        out: dict[str, list[Episode]] = {name: [] for name in self.policies}
        by_role: dict[str, list[Episode]] = {r: [] for r in self.roles}
        wins: list[float] = []
        for eps in played:
            for role, ep in eps.items():
                if ep.policy in out and ep.turns:
                    out[ep.policy].append(ep)
                    by_role[role].append(ep)
            learners = [ep for ep in eps.values() if ep.policy in out]
            if len(learners) == 1 and len(eps) >= 1:  # against a pool partner: did it earn more?
                mine = learners[0].episode_return
                others = [ep.episode_return for ep in eps.values() if ep is not learners[0]]
                if others:
                    wins.append(1.0 if mine > max(others) else 0.5 if mine == max(others) else 0.0)
        metrics: dict[str, float] = {"selfplay/pool_size": float(len(self.pool.state.pool))}
        for role, eps in by_role.items():
            if eps:
                metrics[f"selfplay/{role}/success_rate"] = sum(ep.success for ep in eps) / len(eps)
                metrics[f"selfplay/{role}/return_mean"] = sum(ep.episode_return for ep in eps) / len(eps)
        if wins:
            metrics["selfplay/win_vs_pool"] = sum(wins) / len(wins)
        return out, metrics


def make_selfplay(cfg: TrainConfig, *, roles: Sequence[str], policies: dict[str, Policy], out: Path,
                  state: RunState, runtime: Runtime) -> SelfPlay:
    """The self-play of ``cfg.selfplay`` on an env with ``roles``: its pool under ``out`` and the env's scripted
    training partners (``selfplay.scripted`` of them; all by default)."""
    sp = cfg.selfplay
    refused = [(cfg.rollout.workers > 0, f"rollout.workers = {cfg.rollout.workers}", "rollout.workers=0"),
               (cfg.rollout.best_of > 1, f"rollout.best_of = {cfg.rollout.best_of}", "rollout.best_of=1"),
               (cfg.critic.branch_states > 0, f"critic.branch_states = {cfg.critic.branch_states}",
                "critic.branch_states=0"),
               (distributed.active(), f"--nproc {distributed.world_size()}", "one process"),
               (cfg.rollout.engine != "home", f"rollout.engine = {cfg.rollout.engine}", "rollout.engine=home")]
    for hit, what, fix in refused:
        if hit:
            raise ValueError(f"Expected self-play ({cfg.env.id} with {dict(cfg.env.kwargs)}) to collect in the "
                             f"training process with plain sampling, got {what}: use {fix}")
    partners = training_partners(cfg.env.id)
    unknown = sorted(set(sp.scripted) - set(partners))
    if unknown:
        raise ValueError(f"selfplay.scripted: expected names among the env's training partners "
                         f"{sorted(partners) or 'none'}, got {unknown}")
    if sp.scripted:
        partners = {k: v for k, v in partners.items() if k in sp.scripted}
    pool = OpponentPool(out, state, size=sp.pool_size, runtime=runtime)
    return SelfPlay(roles=roles, policies=policies, pool=pool, partners=partners, mix=sp.mix.shares(),
                    seed=cfg.run.seed)


def role_policies(main: Policy, roles: Sequence[str], *, demos: Sequence[dict], feature_names: Sequence[str],
                  resume_from: Path | None, system: Callable[[str], str] | None = None,
                  cfg: TrainConfig | None = None) -> dict[str, Policy]:
    """``selfplay.weights: per_role``: a policy for each of ``roles`` (beside ``main``, the first role's), started
    from ``main``'s actor (or, on resume, the checkpoint's ``roles/<role>/actor``), each with a critic of its own
    and ``main``'s settings and demonstrations. ``system`` (role -> its system prompt; a hierarchy's): each role's
    own demonstrations instead (the records of its ``role``), tokenized in its own context. ``cfg``: the config
    they train under (default ``main``'s; a hierarchy's manager, ``main``, may carry its own)."""
    cfg = cfg or main.cfg
    out = {}
    for role in roles:
        saved = resume_from / "roles" / role / "actor" if resume_from is not None else None
        actor = load_actor(saved).to(main.runtime) if saved is not None else copy.deepcopy(main.actor)
        critic = build_critic(cfg, demos, actor, feature_names)
        critic.to(main.runtime)
        mine = main.demos
        if system is not None:
            prompt = system(role) if main.settings.system_prompt else None
            mine = [tokenize_demo(actor, main.settings, rec, system=prompt).segments for rec in role_demos(demos, role)]
        out[role] = Policy(name=role, actor=actor, critic=critic, demos=mine, cfg=cfg, runtime=main.runtime,
                           state=main.state, settings=main.settings, py_rng=main.py_rng, gen=main.gen,
                           on_message=main.on_message)
    return out
