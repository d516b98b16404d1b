"""Serving a hierarchical checkpoint (``hierarchy:`` in its config): the manager that sets subgoals and the worker
that carries them out, both behind one session.

* The version's actor is the **worker** (the checkpoint's ``roles/worker/actor/``): its engine batches every
  session's worker turns, as a flat version's engine does. The **manager** (the checkpoint's ``actor/``) is a
  second policy of the version with an engine of its own (:class:`ManagerPolicy`, greedy decoding), so the
  managers of concurrent sessions are batched too; each session leases a row of both engines and keeps the
  manager's conversation (:class:`SessionManager`).
* An **environment session** plays the env from the worker's seat of
  :class:`~polyturn.envs.hierarchy.HierarchicalEnv` (:class:`~polyturn.acting.hierarchy.WorkerSeat`): the manager
  sets the first subgoal when the task starts, then again after the worker's ``subgoal_done[]`` and after ``k``
  worker turns on one subgoal, as in training and evaluation; the worker's turns (``subgoal_done[]`` included) are
  the session's turns.
* A **chat session** (``/v1/chat/completions`` with ``session_id``, or ``/v1/sessions/{id}/turns`` with a
  ``message``): the client runs the tools, so the env under the hierarchy is the client (:class:`ClientEnv`: the
  result of each worker action is the client's next message). The manager is asked at the start, after ``k``
  worker turns and when the worker writes ``subgoal_done[]``; that turn is never sent to the client: the worker is
  sampled again under the new subgoal before the server answers, so the client sees only tool calls and replies.
  The worker reads ``Subgoal: <text>`` lines as in training; the client's messages never hold them (the server
  keeps the worker's context apart from the messages the client sends back).

Either way the current subgoal and the subgoals so far are in the session's state (``GET /v1/sessions/{id}``:
``hierarchy``), in each completion's response (``subgoal``) and in the recorded episode (``role`` ``worker``,
``hierarchy``: the subgoals and the manager's turns with their token ids; each worker turn's
``info.subgoal_index``; a chat turn the client never saw has ``info.hidden``).

What is refused, with the fix: a completion without a session (the hierarchy's state lives in the session), a
hierarchical and a flat version on one server (auto-routed completions without a session would fail on one arm
only), a multi-role env under the hierarchy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from polyturn.acting.checkpoint import hierarchy_dirs
from polyturn.acting.hierarchy import WorkerSeat, hierarchical
from polyturn.acting.policies import PolicySpec
from polyturn.config import HierarchyConfig
from polyturn.envs.actions import ToolCall, parse_action
from polyturn.envs.hierarchy import DONE_TOOL, MANAGER
from polyturn.envs.multi_agent import is_multi_agent
from polyturn.models.actor import Actor
from polyturn.rollout.context import RolloutSettings
from polyturn.serve.conversation import ChatState, Item, RequestError, with_user_message
from polyturn.serve.engine import Engine, TurnRequest, TurnResult

log = logging.getLogger(__name__)

#: The most ``subgoal_done[]`` turns a chat turn samples again before it answers the client with the last one
#: (a worker that only ever declares its subgoal done would otherwise never answer).
MAX_HIDDEN_DONES = 4


@dataclass
class ManagerPolicy:
    """A hierarchical version's manager: its actor, its engine and the hierarchy it was trained in."""

    actor: Actor
    settings: RolloutSettings
    engine: Engine
    hierarchy: HierarchyConfig
    env_id: str  # the env it was trained on: a chat session's subgoal menu is this env's


def check_versions(specs: Sequence[PolicySpec], *, loaded: Sequence[tuple[str, bool]] = ()) -> None:
    """A ``ValueError`` with the fix unless the versions of one server (``loaded``: name and whether hierarchical,
    then ``specs``) are all flat or all hierarchical, and each hierarchical one of ``specs`` has both policies on
    disk (:func:`~polyturn.acting.checkpoint.hierarchy_dirs`)."""
    kinds = [*loaded, *((s.label, s.config is not None and s.config.hierarchy is not None) for s in specs)]
    if len({h for _, h in kinds}) > 1:
        raise ValueError(f"Expected the versions of one server to be all hierarchical or all flat, got hierarchical "
                         f"{[n for n, h in kinds if h]} and flat {[n for n, h in kinds if not h]}: a hierarchical "
                         "version answers completions only in a session, so auto-routed completions without one "
                         "would fail on one arm; serve them on two servers")
    for s in specs:
        if s.config is not None and s.config.hierarchy is not None:
            hierarchy_dirs(s)


def load_manager(spec: PolicySpec, *, load: Callable[[Path], Actor], start: Callable[[Actor], Engine],
                 settings: RolloutSettings) -> ManagerPolicy:
    """The manager of the hierarchical checkpoint ``spec``: its actor (``load``: onto the server's device) and its
    engine (``start``)."""
    assert spec.config is not None and spec.config.hierarchy is not None
    manager_dir, _ = hierarchy_dirs(spec)
    actor = load(manager_dir)
    return ManagerPolicy(actor=actor, settings=settings, engine=start(actor), hierarchy=spec.config.hierarchy,
                         env_id=spec.config.env.id)


class SessionManager:
    """One session's manager: a row of the manager's engine and its conversation, decoded greedily
    (:class:`~polyturn.acting.hierarchy.ManagerTurns`; called from a worker thread: it waits on the engine)."""

    def __init__(self, policy: ManagerPolicy, docs: Callable[[], str]) -> None:
        self.policy, self.docs = policy, docs
        self.slot = policy.engine.open_slot()
        self.state = ChatState(policy.actor, policy.settings)

    def act(self, text: str, *, first: bool, forced: str | None = None) -> tuple[str, dict[str, Any]]:
        """The manager's action after ``text`` (see :class:`~polyturn.acting.hierarchy.ManagerTurns`)."""
        if first:
            system = self.docs() if self.policy.settings.system_prompt else None
            self.state.sync(([("system", system)] if system else []) + [("task", text)])
        else:
            self.state.add_observation(text)
        if forced is not None:
            self.state.sync(self.state.items + [("action", forced)])
            return forced, {}
        ctx, restart = self.state.context()
        s = self.policy.settings
        t0 = time.perf_counter()
        req = TurnRequest(slot=self.slot, context=ctx, restart=restart, temperature=0.0,
                          max_new_tokens=s.max_action_tokens, top_p=1.0)
        try:
            res: TurnResult = self.policy.engine.submit(req).result()
        except BaseException:
            self.state.invalidate()
            raise
        actor = self.policy.actor
        action = actor.tokenizer.decode(res.ids if res.hit_cap else res.ids[:-1], skip_special_tokens=False)
        self.state.add_sampled(res.ids, res.logprobs, text=action, hit_cap=res.hit_cap)
        return action, {"action_ids": list(res.ids), "logprobs": [round(x, 6) for x in res.logprobs],
                        "context_ids": list(ctx), "context_restart": restart, "hit_cap": res.hit_cap,
                        "latency_s": time.perf_counter() - t0, "temperature": 0.0}

    def close(self) -> None:
        """Give the engine row back."""
        self.policy.engine.release(self.slot)


class ClientEnv:
    """The env under a chat session's hierarchy: the client. Its task is the first user message, its tool docs
    the client's system prompt, and the observation of a worker's action the client's next message (``answer``,
    set before the action is stepped). It sees nothing of what the tools did: a subgoal checked on the env's state
    reads as not reached (a ``tool:`` check counts the call), and it never ends the game."""

    #: The manager's turn limit (a chat session sets no ``max_subgoals``): none a conversation reaches.
    max_turns = 1_000_000

    def __init__(self, task: str, docs: str) -> None:
        self.task, self.docs = task, docs
        self.answer: str | None = None

    @property
    def unwrapped(self) -> ClientEnv:
        """Itself (the env API)."""
        return self

    def tool_docs(self) -> str:
        """The client's system prompt ("" without one)."""
        return self.docs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """The task: the first user message."""
        return self.task, {"question": self.task, "features": {}, "privileged": ""}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The client's answer to ``action``; no reward, no end."""
        if self.answer is None:
            raise RuntimeError("Expected the client's answer to be set before the worker's action is stepped")
        obs, self.answer = self.answer, None
        call = parse_action(action)
        return obs, 0.0, False, False, {"action_type": call.tool if isinstance(call, ToolCall) else "message",
                                        "action_valid": isinstance(call, ToolCall), "error": None}

    def close(self) -> None:
        """Nothing to close."""


class SessionHierarchy:
    """A hierarchical version's session: its manager, and in a chat session the game over the client, the
    conversation as the client sends it, and the worker's action that the client's next message answers."""

    def __init__(self, policy: ManagerPolicy) -> None:
        self.policy = policy
        self.seat: WorkerSeat | None = None
        self.manager = SessionManager(policy, docs=lambda: self.seat.env.tool_docs(MANAGER) if self.seat else "")
        self.client: list[Item] = []
        self.pending: str | None = None
        self.question = ""

    def env_seat(self, env: Any, env_id: str, seat: tuple[str | None, str | None]) -> WorkerSeat:
        """An env session's env: ``env`` (single-agent, of ``env_id``) played from the worker's seat."""
        if seat != (None, None):
            raise RequestError(f"Expected no role/partner for a hierarchical version, got {seat}: its sessions "
                               "play the worker's seat, and the manager is the version's own policy")
        if is_multi_agent(env):
            raise RequestError(f"Expected a single-agent env for a hierarchical version, got {env_id}, a multi-role "
                               "env: open the session on the env the version was trained on, or serve a flat one")
        self.seat = WorkerSeat(hierarchical(env, env_id, self.policy.hierarchy), self.manager)
        return self.seat

    def close(self) -> None:
        """Give the manager's row back."""
        self.manager.close()

    def forget(self) -> None:
        """A chat session starts over: the next message starts a new game."""
        self.seat, self.client, self.pending = None, [], None

    def broken(self) -> None:
        """A chat turn failed midway: the next request starts the game over (replaying the conversation)."""
        self.seat = None

    # ---- a chat session's game (run in a worker thread: the manager waits on its engine) ---------------------
    def new_items(self, items: list[Item]) -> list[Item] | None:
        """What ``items`` (the request's conversation) add to the game's; None when they do not extend it."""
        n = len(self.client)
        if self.seat is None or self.seat.over or len(items) <= n or items[:n] != self.client:
            return None
        return items[n:]

    def start(self, items: list[Item]) -> list[Item]:
        """A new game over the conversation ``items``: the worker's context items (its system prompt when the
        client sent one, its task with the first subgoal, then the conversation replayed)."""
        system = items[0][1] if items[0][0] == "system" else None
        body = items[1:] if system is not None else items
        env = hierarchical(ClientEnv(body[0][1], system or ""), self.policy.env_id,
                           self.policy.hierarchy.model_copy(update={"max_subgoals": None}))
        self.seat, self.pending, self.question = WorkerSeat(env, self.manager), None, body[0][1]
        obs, _ = self.seat.reset()
        self.client = list(items[: len(items) - len(body) + 1])
        worker: list[Item] = ([("system", self.seat.tool_docs())] if system is not None else []) + [("task", obs)]
        return worker + self.advance(body[1:])

    def advance(self, new: list[Item]) -> list[Item]:
        """Step the game with the client's new items (its answer to the worker's last action; a replayed history's
        assistant messages are the worker's actions): the items they add to the worker's context."""
        assert self.seat is not None
        out: list[Item] = []
        for kind, text in new:
            if kind == "action":
                if self.pending is not None:
                    raise RequestError("Expected a user or tool message after each assistant message of a "
                                       "hierarchical session, got two assistant messages in a row")
                self.pending = text
                out.append(("action", text))
            else:
                assert self.pending is not None  # message_items ends every run of user/tool messages with one item
                if is_done(self.pending):  # a done the client was sent (MAX_HIDDEN_DONES): it steps no env
                    told, *_ = self.seat.step(self.pending)
                    told = f"{text}\n{told}" if told else text
                else:
                    self.seat.env.env.answer = text
                    told, *_ = self.seat.step(self.pending)
                self.pending = None
                out.append(("obs", told))
            self.client.append((kind, text))
        return out

    def shown(self, text: str, item_text: str) -> None:
        """The worker's ``text`` was sent to the client, who sends it back as ``item_text``."""
        self.pending = text
        self.client.append(("action", item_text))

    def subgoal(self) -> dict[str, Any] | None:
        """The subgoal in force: an entry of the game's subgoals (name, text, turns, end, reached)."""
        return self.seat.current() if self.seat is not None else None


class Host(Protocol):
    """What a chat turn needs of the service (:class:`polyturn.serve.service.Service`)."""

    async def agent_turn(self, s: Any, *, endpoint: str, max_tokens: int | None = None,
                         temperature: float | None = None, top_p: float | None = None,
                         on_token: Callable[[int], None] | None = None) -> tuple[TurnResult, str]: ...

    def turn_record(self, s: Any, res: TurnResult, text: str, *, observation: str, latency_s: float) -> dict: ...

    def start_over(self, s: Any, *, reason: str) -> None: ...


def is_done(text: str) -> bool:
    """Whether the worker's action declares its subgoal done."""
    call = parse_action(text)
    return isinstance(call, ToolCall) and call.tool == DONE_TOOL


async def worker_answer(host: Host, s: Any, items: list[Item], *, endpoint: str, max_tokens: int | None = None,
                        temperature: float | None = None, top_p: float | None = None) -> tuple[TurnResult, str]:
    """A hierarchical chat session's turn for the conversation ``items``: the game extended with the client's
    answer (or started over: the turns so far recorded as their own episode), the worker sampled until it writes
    something other than ``subgoal_done[]`` (each done stepped, so the manager sets the next subgoal), every
    worker turn recorded. Returns the last turn, which the caller sends and then passes to
    :meth:`SessionHierarchy.shown`. A failure leaves the game to start over at the next request."""
    h: SessionHierarchy = s.hier
    try:
        new = h.new_items(items)
        if new is None:
            if s.turns:
                host.start_over(s, reason="restart")
            worker = await asyncio.to_thread(h.start, items)
            assert h.seat is not None
            s.task = {"question": h.question, "hierarchy": h.seat.log}
            s.state.sync(worker)
        else:
            s.state.sync(s.state.items + await asyncio.to_thread(h.advance, new))
        assert h.seat is not None
        seat = h.seat
        for hidden in range(MAX_HIDDEN_DONES + 1):
            seen = s.state.items[-1][1]
            t0 = time.perf_counter()
            res, text = await host.agent_turn(s, endpoint=endpoint, max_tokens=max_tokens, temperature=temperature,
                                              top_p=top_p)
            turn = host.turn_record(s, res, text, observation=seen, latency_s=time.perf_counter() - t0)
            turn["info"]["subgoal_index"] = len(seat.log["subgoals"]) - 1
            s.state.add_sampled(res.ids, res.logprobs, text=text, hit_cap=res.hit_cap)
            s.turns.append(turn)
            if not is_done(text):
                break
            if hidden == MAX_HIDDEN_DONES:
                log.warning("session %s: the worker declared %d subgoals done in a row; sending the last",
                            s.id, hidden + 1)
                break
            turn["info"]["hidden"] = True
            told, *_ = await asyncio.to_thread(seat.step, text)
            s.state.add_observation(told)
    except BaseException:
        h.broken()
        raise
    return res, text


async def message_turn(host: Host, s: Any, message: str) -> dict:
    """A hierarchical chat session's ``/turns`` with a user ``message``: the agent's answer."""
    h: SessionHierarchy = s.hier
    items = with_user_message(list(h.client), message)
    res, text = await worker_answer(host, s, items, endpoint="session_turn")
    h.shown(text, text)
    return {"action": text, "n_tokens": len(res.ids), "forced": res.forced, "latency_s": s.turns[-1]["latency_s"],
            "subgoal": h.subgoal()}
