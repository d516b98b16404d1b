"""Hierarchical agents: a manager that sets subgoals and a worker that carries them out, as a two-role env.

:class:`HierarchicalEnv` wraps a single-agent :class:`~polyturn.envs.base.ToolEnv` into a
:class:`~polyturn.envs.multi_agent.MultiAgentEnv` with the roles ``manager`` and ``worker``, so the machinery of
several policies in one run (self-play's collector, per-role policies and role-masked losses) trains both:

* **The manager** writes a subgoal, as a ReAct action: ``Action: set_subgoal[{"name": "verify"}]`` naming an entry
  of the env spec's menu (:class:`~polyturn.envs.spec.Subgoal`), or ``set_subgoal[{"text": "..."}]`` in free
  mode. It writes one at the start, whenever the worker declares its subgoal done, and after ``k`` worker turns on
  one subgoal. It reads the task, then between its turns what the worker did (each worker action's line and the
  env's answer) and why it is asked again.
* **The worker** is the flat actor, conditioned on the current subgoal: it reads the env's observations, each new
  subgoal as a line ``Subgoal: <text>``, and acts on the env with the env's tools, plus ``subgoal_done[]``, which
  declares the subgoal done (a worker turn that does not step the env).

Rewards follow the multi-role contract (a step's reward for a role belongs to its most recent action):

* the worker gets the env's reward for its step, plus ``intrinsic`` (term ``intrinsic/subgoal``) the first time
  the current subgoal's check holds (each subgoal name pays once an episode; an unchecked subgoal pays nothing),
  and minus ``unreached`` (term ``intrinsic/unreached``) on its last turn on a checked subgoal that ends unreached
  (declared done, ``k`` turns spent, or the game over; not one whose check held earlier in the game), so that
  ignoring the manager's subgoal costs something;
* the manager gets the env's reward of every worker step taken under its subgoal (the extrinsic reward only).
  The semi-MDP discounting over the subgoal's duration is applied when the episodes are trained on
  (:func:`subgoal_durations` and :func:`polyturn.algos.gae.semi_mdp_rewards`): every worker turn's info carries
  ``subgoal_index``, the manager turn it served.

The game ends when the env's episode ends (the env's own turn limit truncates it), or, truncated, when the
manager must set a subgoal with none of its ``max_subgoals`` turns left. An invalid manager action (unparseable,
not ``set_subgoal``, a name off the menu) is answered to the manager, counts as its turn, and it acts again.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polyturn.envs.actions import ToolCall, format_action, parse_action
from polyturn.envs.multi_agent import MultiAgentEnv, MultiStep, RoleUpdate
from polyturn.envs.spec import Subgoal

MANAGER, WORKER = "manager", "worker"
SET_TOOL, DONE_TOOL = "set_subgoal", "subgoal_done"
INTRINSIC = "intrinsic/subgoal"
UNREACHED = "intrinsic/unreached"
#: Why the manager is asked for a subgoal (its observation says so, and its turn's info records it).
START, DONE, K_TURNS = "start", "done", "k_turns"


def subgoal_reached(goal: Subgoal, info: Mapping[str, Any]) -> bool:
    """Whether the env step whose ``info`` is given shows ``goal`` reached (its ``check``; False when unchecked)."""
    if goal.check is None:
        return False
    if goal.check == "success":
        return bool(info.get("success"))
    kind, _, arg = goal.check.partition(":")
    if kind == "subgoal":
        return arg in (info.get("subgoals") or ())
    return info.get("action_type") == arg and info.get("error") is None and bool(info.get("action_valid", True))


def applies(goal: Subgoal, reset_info: Mapping[str, Any]) -> bool:
    """Whether ``goal`` applies to the task whose reset info is given (its ``when`` key is true, or it has none)."""
    return goal.when is None or bool(reset_info.get(goal.when))


@dataclass
class _Active:
    """The subgoal in force: its menu entry (a made-up one in free mode), its manager turn, its worker turns."""

    goal: Subgoal
    index: int
    turns: int = 0
    reached: bool = False


@dataclass
class _Game:
    reset_info: dict[str, Any]
    worker_info: dict[str, Any]
    active: _Active | None = None
    manager_turns: int = 0
    paid: set[str] = field(default_factory=set)  # subgoal names whose intrinsic reward was paid
    reached: set[str] = field(default_factory=set)  # subgoal names reached at any time
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per subgoal set: name, turns, end
    log: list[str] = field(default_factory=list)  # what the manager is told at its next turn
    turn: str = MANAGER
    over: bool = False


class HierarchicalEnv(MultiAgentEnv):
    """A manager and a worker over one single-agent env (see the module docstring).

    Args:
        env: the single-agent ToolEnv (or its gymnasium wrapper).
        subgoals: the env spec's menu; empty only in free mode.
        mode: ``menu`` (the manager names an entry) or ``free`` (it writes the subgoal's text).
        k: the most worker turns on one subgoal before the manager is asked again.
        intrinsic: the worker's reward for reaching its subgoal (0: none).
        unreached: the worker's penalty for a checked subgoal it leaves unreached (0: none).
        max_subgoals: the manager's turns (invalid ones included); None: the env's ``max_turns``.
    """

    roles = (MANAGER, WORKER)

    def __init__(self, env: Any, *, subgoals: Sequence[Subgoal] = (), mode: str = "menu", k: int = 4,
                 intrinsic: float = 1.0, unreached: float = 0.0, max_subgoals: int | None = None) -> None:
        if mode not in ("menu", "free"):
            raise ValueError(f"Expected hierarchy mode 'menu' or 'free', got {mode!r}")
        if mode == "menu" and not subgoals:
            raise ValueError(f"Expected a subgoal menu for hierarchy mode 'menu', got none: the env "
                             f"{type(env.unwrapped).__name__} offers no subgoals (EnvSpec.subgoals); use mode 'free'")
        if k < 1:
            raise ValueError(f"Expected hierarchy k >= 1 (worker turns per subgoal), got {k}")
        if unreached < 0:
            raise ValueError(f"Expected hierarchy unreached >= 0 (a penalty's size), got {unreached}")
        if max_subgoals is not None and max_subgoals < 1:
            raise ValueError(f"Expected hierarchy max_subgoals >= 1, got {max_subgoals}")
        self.base = env
        self.env = env.unwrapped
        self.menu = {g.name: g for g in subgoals}
        self.mode, self.k, self.intrinsic, self.unreached = mode, k, float(intrinsic), float(unreached)
        self.max_subgoals = max_subgoals
        self._g: _Game | None = None

    # ---- the contract -----------------------------------------------------------------------------
    @property
    def agent_selection(self) -> str:
        return self._game().turn

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
        super().reset(seed=seed)
        obs, info = self.base.reset(seed=seed, options=options)
        self._g = _Game(reset_info=dict(info), worker_info=dict(info))
        return {MANAGER: (f"Task: {obs}\n{self._ask(START)}", self._info(MANAGER, info)),
                WORKER: (obs, self._info(WORKER, info))}

    def step(self, action: str) -> MultiStep:  # type: ignore[override]
        g = self._game()
        if g.over:
            raise RuntimeError("Expected reset() before step(), got step() on a finished game")
        return self._manager_step(g, action) if g.turn == MANAGER else self._worker_step(g, action)

    def tool_docs(self, role: str) -> str:
        if role == WORKER:
            return (f"{self.env.tool_docs()}\n\nA manager sets your current subgoal (a line 'Subgoal: ...'): work on "
                    f"it. When it is done, write the action {DONE_TOOL}[] and the manager sets the next one.")
        if role != MANAGER:
            raise ValueError(f"Expected a role among {self.roles}, got {role!r}")
        head = ("You manage an agent that works on the task below with tools. Set its next subgoal, one at a time: "
                "at the start, when it says its subgoal is done, and when it has worked on one for "
                f"{self.k} turns. Write one action:\n")
        if self.mode == "menu":
            menu = "\n".join(f"- {g.name}: {g.text}" for g in self.menu.values())
            return (f"{head}Action: {SET_TOOL}[{{\"name\": \"<subgoal>\"}}] with one of these subgoals:\n{menu}\n\n"
                    f"The agent's tools:\n{self.env.tool_docs()}")
        return (f"{head}Action: {SET_TOOL}[{{\"text\": \"<the subgoal, one sentence>\"}}]\n\n"
                f"The agent's tools:\n{self.env.tool_docs()}")

    def sample_valid_action(self, rng: Any) -> str:
        g = self._game()
        if g.turn == WORKER:
            return self.env.sample_valid_action(rng)
        if self.mode == "free":
            return format_action(SET_TOOL, {"text": "Make progress on the task."})
        names = list(self.menu)
        return format_action(SET_TOOL, {"name": names[int(rng.integers(len(names)))]})

    def role_view(self, role: str) -> Mapping[str, Any]:
        g = self._game()
        return {"role": role, "menu": tuple(self.menu.values()), "reset_info": dict(g.reset_info),
                "current": g.active.goal.name if g.active else None, "reached": frozenset(g.reached),
                "history": [dict(h) for h in g.history], "manager_turns": g.manager_turns}

    def close(self) -> None:
        self.base.close()

    # ---- the manager ------------------------------------------------------------------------------
    def _manager_step(self, g: _Game, action: str) -> MultiStep:
        g.manager_turns += 1
        goal, error = self._parse(action)
        info_m = {**self._info(MANAGER, g.worker_info), "action_type": SET_TOOL if goal else "invalid",
                  "action_valid": goal is not None, "error": error, "wasted": False, "reward_terms": {}}
        updates = {MANAGER: RoleUpdate(info=info_m), WORKER: RoleUpdate(info=self._info(WORKER, g.worker_info))}
        if goal is None:
            updates[MANAGER].observation = f"Error: {error}"
            return self._maybe_out_of_subgoals(g, updates)
        g.active = _Active(goal=goal, index=len(g.history))
        g.history.append({"name": goal.name, "text": goal.text, "turns": 0, "end": None, "reached": False})
        updates[MANAGER].info |= {"subgoal": goal.name, "subgoal_index": g.active.index}
        updates[WORKER].observation = f"Subgoal: {goal.text}"
        g.turn = WORKER
        return MultiStep(updates=updates, terminated=False, truncated=False)

    def _parse(self, action: str) -> tuple[Subgoal | None, str | None]:
        call = parse_action(action)
        if not isinstance(call, ToolCall):
            return None, f"format ({call.kind}): write one action, {SET_TOOL}[{{...}}]"
        if call.tool != SET_TOOL:
            return None, f"unknown tool {call.tool!r}: the manager's one tool is {SET_TOOL}"
        if self.mode == "free":
            text = call.args.get("text")
            if not isinstance(text, str) or not text.strip():
                return None, f'bad args: expected {SET_TOOL}[{{"text": "<the subgoal>"}}]'
            return Subgoal(name="free", text=" ".join(text.split())[:300]), None
        name = call.args.get("name")
        if name not in self.menu:
            return None, f"bad args: expected a subgoal name among {list(self.menu)}, got {name!r}"
        return self.menu[name], None

    def _maybe_out_of_subgoals(self, g: _Game, updates: dict[str, RoleUpdate]) -> MultiStep:
        """After a manager turn that set nothing: the manager acts again, unless it has no turns left."""
        limit = self.max_subgoals or self.env.max_turns
        if g.manager_turns < limit:
            return MultiStep(updates=updates, terminated=False, truncated=False)
        return self._end(g, updates, terminated=False)

    # ---- the worker -------------------------------------------------------------------------------
    def _worker_step(self, g: _Game, action: str) -> MultiStep:
        a = g.active
        assert a is not None  # the manager always sets one before the worker's turn
        a.turns += 1
        g.history[a.index]["turns"] = a.turns
        call = parse_action(action)
        if isinstance(call, ToolCall) and call.tool == DONE_TOOL:
            info_w = {**self._info(WORKER, g.worker_info), "action_type": DONE_TOOL, "action_valid": True,
                      "error": None, "wasted": False, "reward_terms": {}, "subgoal_index": a.index,
                      "subgoal": a.goal.name, "subgoal_text": a.goal.text,
                      "subgoal_checked": a.goal.check is not None,
                      "cost_terms": {k: 0.0 for k in (g.worker_info.get("cost_terms") or {})}}
            updates = {MANAGER: RoleUpdate(info=self._info(MANAGER, g.worker_info)),
                       WORKER: RoleUpdate(info=info_w)}
            self._charge_unreached(g, a, updates[WORKER])
            return self._switch(g, updates, DONE)
        obs, reward, terminated, truncated, info = self.base.step(action)
        g.worker_info = dict(info)
        terms = dict(info.get("reward_terms") or {})
        extrinsic = float(reward)
        if subgoal_reached(a.goal, info):
            a.reached = True
            g.history[a.index]["reached"] = True
            if a.goal.name not in g.paid and self.intrinsic:
                g.paid.add(a.goal.name)
                terms[INTRINSIC] = self.intrinsic
        for goal in self.menu.values():
            if subgoal_reached(goal, info):
                g.reached.add(goal.name)
        info_w = {**self._info(WORKER, info), **{k: v for k, v in info.items() if k != "features"},
                  "reward_terms": terms, "subgoal_index": a.index, "subgoal": a.goal.name,
                  "subgoal_text": a.goal.text, "subgoal_checked": a.goal.check is not None}
        g.log.append(f"Worker: {_action_line(action)}\nResult: {_first_lines(obs)}")
        updates = {MANAGER: RoleUpdate(reward=extrinsic, reward_terms=dict(info.get("reward_terms") or {}),
                                       info=self._info(MANAGER, info)),
                   WORKER: RoleUpdate(observation=obs, reward=extrinsic + terms.get(INTRINSIC, 0.0),
                                      reward_terms=terms, info=info_w)}
        over = terminated or truncated
        if over or a.turns >= self.k:  # the subgoal's last turn
            self._charge_unreached(g, a, updates[WORKER])
        if over:
            return self._end(g, updates, terminated=terminated)
        if a.turns >= self.k:
            return self._switch(g, updates, K_TURNS)
        return MultiStep(updates=updates, terminated=False, truncated=False)

    def _charge_unreached(self, g: _Game, a: _Active, update: RoleUpdate) -> None:
        """The worker's penalty on its last turn on ``a`` when ``a`` is checked and its check has held at no step of
        the game so far (one reached earlier, under any subgoal, and set again is not charged: its check may not
        hold twice)."""
        if self.unreached and a.goal.check is not None and a.goal.name not in g.reached:
            update.reward -= self.unreached
            update.reward_terms[UNREACHED] = -self.unreached
            update.info["reward_terms"] = update.reward_terms

    def _switch(self, g: _Game, updates: dict[str, RoleUpdate], why: str) -> MultiStep:
        a = g.active
        assert a is not None
        g.history[a.index]["end"] = why
        g.log.append(self._ask(why, a))
        limit = self.max_subgoals or self.env.max_turns
        if g.manager_turns >= limit:
            return self._end(g, updates, terminated=False)
        g.turn = MANAGER
        updates[MANAGER].observation = "\n".join(g.log)
        g.log = []
        return MultiStep(updates=updates, terminated=False, truncated=False)

    def _end(self, g: _Game, updates: dict[str, RoleUpdate], *, terminated: bool) -> MultiStep:
        g.over = True
        if g.active is not None and g.history[g.active.index]["end"] is None:
            g.history[g.active.index]["end"] = "game_end"
        success = bool(g.worker_info.get("success")) and terminated
        for up in updates.values():
            up.info["success"] = success
            up.info["subgoals_set"] = [dict(h) for h in g.history]
        return MultiStep(updates=updates, terminated=terminated, truncated=not terminated)

    # ---- helpers ----------------------------------------------------------------------------------
    def _ask(self, why: str, a: _Active | None = None) -> str:
        if why == START:
            return "Set the first subgoal."
        assert a is not None
        state = "reached" if a.reached else "not reached" if a.goal.check else "not checkable"
        said = "the worker says it is done" if why == DONE else f"{a.turns} worker turns on it"
        return f"Subgoal {a.goal.name} ({state}): {said}. Set the next subgoal."

    def _info(self, role: str, info: Mapping[str, Any]) -> dict[str, Any]:
        g = self._game()
        a = g.active
        features = {**dict(info.get("features") or {}), "h_subgoals_set": float(len(g.history)),
                    "h_subgoal_turns": float(a.turns if a else 0), "h_reached": float(len(g.reached))}
        out = {k: g.reset_info[k] for k in ("task_id", "question", "level", "ambiguous", "key_actions")
               if k in g.reset_info}
        return {**out, "features": features, "privileged": str(info.get("privileged", g.reset_info.get("privileged", ""))),
                "role": role}

    def _game(self) -> _Game:
        if self._g is None:
            raise RuntimeError("Expected reset() before using the hierarchical env")
        return self._g


def _action_line(action: str) -> str:
    call = parse_action(action)
    if isinstance(call, ToolCall):
        return format_action(call.tool, call.args)
    return " ".join(action.split())[:200]


def _first_lines(text: str, n: int = 6) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:n]) + (" ..." if len(lines) > n else "")


class PlanManager:
    """A scripted manager: the first subgoal of the menu that applies to the task and is neither reached nor set
    before, else the last one (the subgoal that ends the task). A training partner for the worker alone
    (``polyturn serve`` of a worker, evaluation of a worker against a fixed plan)."""

    name = "plan"

    def act(self, view: Mapping[str, Any], rng: random.Random) -> str:
        menu: Sequence[Subgoal] = view["menu"]
        tried = {h["name"] for h in view["history"]}
        for goal in menu:
            if applies(goal, view["reset_info"]) and goal.name not in view["reached"] and goal.name not in tried:
                return format_action(SET_TOOL, {"name": goal.name}, thought=f"Next: {goal.text}")
        return format_action(SET_TOOL, {"name": menu[-1].name}, thought=f"Next: {menu[-1].text}")


def subgoal_durations(manager_turn_infos: Sequence[Mapping[str, Any]],
                      worker_turn_infos: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each manager turn's duration in worker turns, from the ``subgoal_index`` both roles' turns carry (the
    subgoal a valid manager turn set; the subgoal a worker turn served); 0 for a manager turn that set nothing."""
    counts: dict[int, int] = {}
    for info in worker_turn_infos:
        counts[int(info["subgoal_index"])] = counts.get(int(info["subgoal_index"]), 0) + 1
    return [counts.get(int(info["subgoal_index"]), 0) if "subgoal_index" in info else 0
            for info in manager_turn_infos]
