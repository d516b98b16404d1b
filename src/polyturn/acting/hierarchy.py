"""Hierarchical demonstrations: the env's scripted expert as the worker, cut into the subgoals it reaches, and a
manager that sets them in that order (:mod:`polyturn.envs.hierarchy`).

A demonstration is made in two passes over one task:

1. the expert plays the single-agent env alone; each step's info says which menu subgoals it reached
   (:func:`~polyturn.envs.hierarchy.subgoal_reached`). The plan is the subgoals in the order they were first
   reached (one per step: the first in menu order when a step reaches several; the ones reached with it are left
   out of the plan), and each subgoal's chunk is the expert's actions up to the step that reached it. Actions after
   the last subgoal reached (a failed noisy episode) go to the next subgoal of the menu that applies.
2. the same actions are replayed in :class:`~polyturn.envs.hierarchy.HierarchicalEnv`: the manager sets the plan's
   next subgoal when asked after a ``done`` (the same one again after ``k`` worker turns), the worker writes its
   chunk's actions and then ``subgoal_done[]`` (not after the chunk that ends the episode).

:func:`play_game` records what each role was shown exactly as the collector shows it
(:class:`~polyturn.rollout.multi.MultiAgentCollector`: a role's first text is its introduction joined with what it
was told before it acts, then what it was told between its turns), so BC reads the contexts RL samples from. Each
game gives two records, ``role`` ``manager`` and ``worker``, with the task's seed.

Acting with a trained hierarchy: :func:`play_hierarchy` seats both policies in
:class:`~polyturn.rollout.multi.MultiAgentCollector` games and returns the worker's episodes (training's held-out
evaluation, and :class:`HierarchyCollector`, which ``polyturn evaluate`` / ``diagnose`` / ``play`` run through
:func:`polyturn.acting.checkpoint.run_actor`); :class:`WorkerSeat` plays the game from the worker's seat, one step
at a time, with a manager that reads its own text (``polyturn serve``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from polyturn.acting.episodes import episode_head
from polyturn.acting.registry import env_id_of, env_spec, make_env, make_expert
from polyturn.envs.actions import format_action
from polyturn.envs.hierarchy import (DONE_TOOL, MANAGER, SET_TOOL, WORKER, HierarchicalEnv, PlanManager, applies,
                                    subgoal_reached)
from polyturn.envs.multi_agent import MultiStep
from polyturn.envs.spec import Subgoal
from polyturn.models.actor import Actor
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.multi import MultiAgentCollector, Seat
from polyturn.rollout.types import TURN_INFO_KEYS, Episode, cost_field

#: A scripted seat of :func:`play_game`: ``act(role_view) -> action text``.
Act = Callable[[Mapping[str, Any]], str]
HIERARCHY_INFO_KEYS = (*TURN_INFO_KEYS, "subgoal_index", "subgoal")


def role_demos(records: Sequence[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    """The demonstration records ``role`` learns from: those of its ``role``, and those of no role (a single-agent
    env's, which every role of a self-play run learns from)."""
    return [r for r in records if r.get("role", role) == role]


def play_game(env: HierarchicalEnv, players: Mapping[str, Act], *, seed: int | None, env_id: str,
              label: str = "expert") -> dict[str, dict[str, Any]]:
    """Play one game with scripted ``players`` (role -> act); each role's episode record (``role`` set)."""
    starts = env.reset(seed=seed)
    records = {r: episode_head(env_id=env_id, seed=seed, policy=label, info=starts[r][1]) | {"role": r}
               for r in env.roles}
    intro = {r: starts[r][0] for r in env.roles}
    inbox: dict[str, list[str]] = {r: [] for r in env.roles}
    last: dict[str, dict[str, Any]] = {}
    while True:
        role = env.agent_selection
        told = "\n".join(inbox[role])
        inbox[role] = []
        seen = (intro[role] + ("\n" + told if told else "")) if role not in last else told
        action = players[role](env.role_view(role))
        ms = env.step(action)
        info = ms.updates[role].info
        turn = {"observation": seen, "action": action, "reward": 0.0, "reward_terms": {}, **cost_field(info),
                "terminated": False, "truncated": False,
                "info": {k: (dict(info[k]) if k == "features" else info[k]) for k in HIERARCHY_INFO_KEYS if k in info}}
        records[role]["turns"].append(turn)
        last[role] = turn
        for r, up in ms.updates.items():
            if up.observation is not None:
                inbox[r].append(up.observation)
            if r in last:
                last[r]["reward"] += float(up.reward)
                for k, v in up.reward_terms.items():
                    last[r]["reward_terms"][k] = last[r]["reward_terms"].get(k, 0.0) + float(v)
        if ms.terminated or ms.truncated:
            for r, rec in records.items():
                if r in last:
                    last[r]["terminated"], last[r]["truncated"] = bool(ms.terminated), bool(ms.truncated)
                rec["success"] = bool(ms.updates[r].info.get("success", False))
                rec["final_observation"] = "\n".join(inbox[r])
                rec["return"] = sum(t["reward"] for t in rec["turns"])
                rec["subgoals_set"] = ms.updates[r].info.get("subgoals_set", [])
            return records


def expert_plan(env: Any, actions_infos: Sequence[tuple[str, Mapping[str, Any]]], menu: Sequence[Subgoal],
                reset_info: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """Pass 1's result: the subgoals in the order the expert reached them, each with its chunk of actions."""
    plan: list[tuple[str, list[str]]] = []
    chunk: list[str] = []
    reached: set[str] = set()
    for action, info in actions_infos:
        chunk.append(action)
        new = [g for g in menu if g.name not in reached and subgoal_reached(g, info)]
        reached |= {g.name for g in new}
        if new:
            plan.append((new[0].name, chunk))
            chunk = []
    if chunk:  # the expert ended without reaching another subgoal: the next one of the menu
        rest = [g.name for g in menu if applies(g, reset_info) and g.name not in reached]
        plan.append((rest[0] if rest else menu[-1].name, chunk))
    return plan


def hierarchical_episode(env: HierarchicalEnv, expert: Any, *, seed: int, env_id: str) -> dict[str, dict[str, Any]]:
    """One task's demonstration pair (see the module docstring): the expert's single-agent episode, cut into
    subgoals and replayed with a manager that sets them."""
    base = env.base
    obs, info = base.reset(seed=seed)
    reset_info = dict(info)
    expert.reset(obs, info)
    steps: list[tuple[str, Mapping[str, Any]]] = []
    while True:
        action = expert.act(obs, info)
        obs, _, terminated, truncated, info = base.step(action)
        steps.append((action, info))
        if terminated or truncated:
            break
    menu = list(env.menu.values())
    plan = expert_plan(base, steps, menu, reset_info)
    texts = {g.name: g.text for g in menu}
    cursor = {"goal": -1, "action": 0}

    def manager(view: Mapping[str, Any]) -> str:
        history = view["history"]
        if not history or history[-1]["end"] == "done":
            cursor["goal"] += 1
            cursor["action"] = 0
        name = plan[min(cursor["goal"], len(plan) - 1)][0]
        args = {"name": name} if env.mode == "menu" else {"text": texts[name]}  # free mode: the menu's text
        return format_action(SET_TOOL, args, thought=f"Next: {texts[name]}")

    def worker(view: Mapping[str, Any]) -> str:
        name, chunk = plan[min(cursor["goal"], len(plan) - 1)]
        if cursor["action"] >= len(chunk):
            return format_action(DONE_TOOL, {}, thought=f"Done: {texts[name]}")
        cursor["action"] += 1
        return chunk[cursor["action"] - 1]

    return play_game(env, {MANAGER: manager, WORKER: worker}, seed=seed, env_id=env_id)


def make_hierarchical(env_id: str, env_kwargs: Mapping[str, Any] | None, hierarchy: Any) -> HierarchicalEnv:
    """``env_id`` (made with ``env_kwargs``) as a manager and a worker, by the run's ``hierarchy`` settings
    (:class:`~polyturn.config.HierarchyConfig`: mode, k, intrinsic, unreached, max_subgoals) and the env spec's
    menu."""
    base = make_env(env_id, env_kwargs)
    try:
        return hierarchical(base, env_id, hierarchy)
    except ValueError:
        base.close()
        raise


def hierarchical(base: Any, env_id: str, hierarchy: Any) -> HierarchicalEnv:
    """The env ``base`` (an env of ``env_id``, already made) as a manager and a worker (see
    :func:`make_hierarchical`); ``hierarchy.max_subgoals`` and the env spec's menu as in training."""
    spec = env_spec(env_id)
    if hierarchy.mode == "menu" and not spec.subgoals:
        raise ValueError(f"Expected {env_id} to offer subgoals (EnvSpec.subgoals) for hierarchy.mode menu, got "
                         "none: set hierarchy.mode=free, or add a subgoal menu to the env's spec")
    return HierarchicalEnv(base, subgoals=spec.subgoals, mode=hierarchy.mode, k=hierarchy.k,
                           intrinsic=hierarchy.intrinsic, unreached=hierarchy.unreached,
                           max_subgoals=hierarchy.max_subgoals)


def play_hierarchy(collector: MultiAgentCollector, tasks: Sequence[Mapping[str, Any]], actors: Mapping[str, Actor],
                   *, temperature: float, label: str, generator: torch.Generator | None = None,
                   progress: Callable[[int], None] | None = None) -> list[Episode]:
    """The worker's episodes of ``tasks`` (``{"seed", "options"}``), in task order, ``actors[manager]`` and
    ``actors[worker]`` playing every game of ``collector`` (hierarchical envs); both seats are named ``label``."""
    missing = {MANAGER, WORKER} - set(actors)
    if missing:
        raise ValueError(f"Expected a manager and a worker actor, got none for {sorted(missing)}")
    seats = {r: Seat(label, actor=actors[r]) for r in (MANAGER, WORKER)}
    out = collector.collect([{**t, "seats": seats} for t in tasks], temperature=temperature, generator=generator,
                            progress=progress)
    return [eps[WORKER] for eps in out]


class HierarchyCollector:
    """A hierarchical checkpoint's collector: :meth:`collect` plays tasks in ``envs`` (single-agent envs of
    ``env_id``, each wrapped as a manager and a worker) with both policies and returns the worker's episodes, as
    :meth:`polyturn.rollout.collector.Collector.collect` returns an actor's; ``actor`` is the worker."""

    def __init__(self, envs: Sequence[Any], *, env_id: str, settings: RolloutSettings, manager: Actor, worker: Actor,
                 hierarchy: Any) -> None:
        self.actor, self.manager = worker, manager
        self.envs = [hierarchical(e.unwrapped, env_id, hierarchy) for e in envs]
        self.multi = MultiAgentCollector(self.envs, env_id=env_id, settings=settings)

    def collect(self, tasks: Sequence[Mapping[str, Any]], *, temperature: float,
                generator: torch.Generator | None = None, progress: Callable[[int], None] | None = None,
                policy: str = "actor") -> list[Episode]:
        """Every task played to its end by the manager and the worker; the worker's episodes (labelled ``policy``)."""
        return play_hierarchy(self.multi, tasks, {MANAGER: self.manager, WORKER: self.actor},
                              temperature=temperature, label=policy, generator=generator, progress=progress)


def hierarchical_demos(env_id: str, *, episodes: int, noise: Any, seed: int, k: int, mode: str = "menu",
                       env_kwargs: Mapping[str, Any] | None = None, expert_options: Mapping[str, Any] | None = None,
                       progress: Callable[[int], None] | None = None) -> Iterator[dict[str, Any]]:
    """Demonstration records of a hierarchical agent on ``env_id``: for seeds ``seed, seed + 1, ...`` the manager's
    record and then the worker's (see the module docstring); ``progress(1)`` after each task. In ``free`` mode the
    manager writes each menu subgoal's text instead of its name (the menu still cuts the expert's episodes)."""
    spec = env_spec(env_id)
    if not spec.subgoals:
        raise ValueError(f"Expected {env_id} to offer subgoals (EnvSpec.subgoals) to cut the expert's "
                         "demonstrations into, got none: add a subgoal menu to the env's spec, or give a hierarchical "
                         "run its demonstrations (bc.demos: manager and worker records)")
    base = make_env(env_id, env_kwargs)
    env = HierarchicalEnv(base, subgoals=spec.subgoals, k=k, mode=mode)
    try:
        expert = make_expert(base, noise=noise, seed=seed, options=expert_options)
        for i in range(episodes):
            pair = hierarchical_episode(env, expert, seed=seed + i, env_id=env_id_of(base))
            yield pair[MANAGER]
            yield pair[WORKER]
            if progress is not None:
                progress(1)
    finally:
        env.close()


class ManagerTurns(Protocol):
    """A manager policy that keeps its own conversation (:class:`WorkerSeat`'s manager)."""

    def act(self, text: str, *, first: bool, forced: str | None = None) -> tuple[str, dict[str, Any]]:
        """Its next action after reading ``text`` (``first``: its introduction, a new conversation; else what it
        was told since its last action), and what to record of the turn (token ids, timing); with ``forced``,
        that action is written for it instead (added to its conversation, not sampled)."""
        ...


class WorkerSeat:
    """A :class:`~polyturn.envs.hierarchy.HierarchicalEnv` from the worker's seat, as a single-agent env:
    ``reset`` / ``step`` return the worker's text, reward, end and info (as
    :class:`~polyturn.envs.multi_agent.SeatedEnv` does for scripted partners), and the manager's turns are played
    in between by ``manager``, which reads its own text as the collector shows it (its introduction, then what it
    was told between its turns).

    ``log`` is the game's record, a new dict at each reset: ``subgoals`` (each one set: name, text, worker turns,
    why it ended, reached) and ``manager_turns`` (what the manager read and wrote, the subgoal it set or the error,
    and what ``manager.act`` reported). Unlike training's games, a manager that writes ``tries`` invalid actions
    in a row (fewer when its turn limit is closer) has the next subgoal set for it, marked ``fallback``: by the
    scripted plan (:class:`~polyturn.envs.hierarchy.PlanManager`), in free mode a generic one; so a served game
    never stalls, nor ends before the worker acts, on a manager that cannot write the action.
    """

    def __init__(self, env: HierarchicalEnv, manager: ManagerTurns, *, tries: int = 3) -> None:
        if tries < 1:
            raise ValueError(f"Expected tries >= 1, got {tries}")
        self.env, self.manager, self.tries = env, manager, tries
        self.log: dict[str, list[dict[str, Any]]] = {"subgoals": [], "manager_turns": []}
        self.over = True
        self._told: dict[str, list[str]] = {MANAGER: [], WORKER: []}
        self._info: dict[str, Any] = {}
        self._first = True
        self._invalid = 0
        self._rng = random.Random(0)

    @property
    def unwrapped(self) -> WorkerSeat:
        """Itself: the seat is the env a session plays."""
        return self

    def tool_docs(self) -> str:
        """The worker's system prompt text."""
        return self.env.tool_docs(WORKER)

    def current(self) -> dict[str, Any] | None:
        """The subgoal in force (an entry of ``log["subgoals"]``), None before the first."""
        return self.log["subgoals"][-1] if self.log["subgoals"] else None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new game: the manager sets the first subgoal; the worker's first text and info (with ``hierarchy``:
        the new game's ``log``)."""
        starts = self.env.reset(seed=seed, options=options)
        self.log = {"subgoals": [], "manager_turns": []}
        self._told = {MANAGER: [starts[MANAGER][0]], WORKER: []}
        self._info = dict(starts[WORKER][1])
        self._first, self._invalid, self.over = True, 0, False
        self._rng = random.Random(f"polyturn-seat-{seed}")
        self._manage()
        return "\n".join([starts[WORKER][0], *self._told[WORKER]]), {**self._info, "hierarchy": self.log}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The worker writes ``action``; the manager's turns that follow are played; what the worker was told, its
        reward, the game's end and its info (its own step's, then what later steps told it)."""
        if self.over:
            raise RuntimeError("Expected reset() before step(), got step() on a finished game")
        self._told[WORKER], self._info = [], {}
        ms = self.env.step(action)
        reward, terms = self._take(ms)
        terminated, truncated = ms.terminated, ms.truncated
        if not (terminated or truncated):
            r, t, terminated, truncated = self._manage()
            reward += r
            for k, v in t.items():
                terms[k] = terms.get(k, 0.0) + v
        self.over = terminated or truncated
        return "\n".join(self._told[WORKER]), reward, terminated, truncated, {**self._info, "reward_terms": terms}

    def close(self) -> None:
        """Close the env."""
        self.env.close()

    def _manage(self) -> tuple[float, dict[str, float], bool, bool]:
        """The manager's turns until the worker's or the end: the worker's reward from them, and the end."""
        reward, terms = 0.0, {}
        while self.env.agent_selection == MANAGER:
            text = "\n".join(self._told[MANAGER])
            self._told[MANAGER] = []
            limit = self.env.max_subgoals or self.env.env.max_turns
            forced = self._fallback() if self._invalid >= min(self.tries, limit - 1) else None
            action, extra = self.manager.act(text, first=self._first, forced=forced)
            self._first = False
            ms = self.env.step(action)
            info = ms.updates[MANAGER].info
            self._invalid = 0 if info.get("action_valid") else self._invalid + 1
            self.log["manager_turns"].append({"observation": text, "action": action, "subgoal": info.get("subgoal"),
                                              "error": info.get("error"), "fallback": forced is not None, **extra})
            r, t = self._take(ms)
            reward += r
            for k, v in t.items():
                terms[k] = terms.get(k, 0.0) + v
            if ms.terminated or ms.truncated:
                return reward, terms, ms.terminated, ms.truncated
        return reward, terms, False, False

    def _fallback(self) -> str:
        if self.env.mode == "menu":
            return PlanManager().act(self.env.role_view(MANAGER), self._rng)
        return format_action(SET_TOOL, {"text": "Make progress on the task."})

    def _take(self, ms: MultiStep) -> tuple[float, dict[str, float]]:
        """Note what ``ms`` told each role and the subgoals so far; the worker's reward from it."""
        for role, up in ms.updates.items():
            if up.observation is not None:
                self._told[role].append(up.observation)
        self.log["subgoals"][:] = self.env.role_view(WORKER)["history"]
        up = ms.updates[WORKER]
        self._info = {**self._info, **up.info}
        return float(up.reward), dict(up.reward_terms)
