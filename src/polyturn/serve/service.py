"""What the HTTP layer calls: versions, sessions, turns, recording — no FastAPI in here.

:class:`Service` owns the loaded versions (one :class:`~polyturn.serve.engine.Engine`
each), the router, the session store, the metrics and the recorder. Every
agent turn goes through :meth:`Service.agent_turn`, which sends only the
session's new tokens to its engine row and returns the action.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from polyturn.acting.checkpoint import hierarchy_dirs, rollout_settings
from polyturn.acting.policies import resolve_policy
from polyturn.acting.registry import env_spec, make_env
from polyturn.acting.seats import seat as seated
from polyturn.config import TrainConfig
from polyturn.envs.actions import ToolCall, parse_action
from polyturn.envs.multi_agent import is_multi_agent
from polyturn.models.actor import Actor, load_actor
from polyturn.models.critic import SeparateCritic
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.context import RolloutSettings
from polyturn.rollout.types import EVAL_TURN_INFO_KEYS, cost_field
from polyturn.serve import hierarchy
from polyturn.serve.conversation import ChatState, RequestError, with_user_message
from polyturn.serve.engine import Engine, TurnRequest, TurnResult
from polyturn.serve.metrics import Metrics
from polyturn.serve.ope_gate import OPEGate
from polyturn.serve.recording import Recorder
from polyturn.serve.routing import Router
from polyturn.serve.sessions import Session, SessionStore
from polyturn.serve.settings import ServeConfig
from polyturn.serve.unbatched import UnbatchedEngine
from polyturn.serve.vllm_engine import VLLMServeEngine

log = logging.getLogger(__name__)

#: The endpoints that run the agent: their requests feed the A/B router's error rate.
AGENT_ENDPOINTS = ("/v1/chat/completions", "/v1/sessions/{session_id}/turns")

# What any environment raises on bad request input: task options, env arguments, a file that is not what the env
# reads (answered 400); an env's spec adds its own (``EnvSpec.request_errors``, e.g. sqlite3.Error).
ENV_REQUEST_ERRORS = (ValueError, TypeError, OSError)


def episode_costs(turns: list[dict[str, Any]]) -> dict[str, float]:
    """Each cost term summed over an episode's recorded turns (empty for an env without cost terms)."""
    out: dict[str, float] = {}
    for t in turns:
        for k, v in t.get("cost_terms", {}).items():
            out[k] = out.get(k, 0.0) + v
    return out


def request_errors(env_id: str | None) -> tuple[type[BaseException], ...]:
    """The exceptions that mean a bad request for an environment of ``env_id``."""
    return ENV_REQUEST_ERRORS + (env_spec(env_id).exception_types() if env_id else ())


@dataclass
class Version:
    """A loaded checkpoint: its actor, rollout settings, config and engine (a hierarchical checkpoint's: the
    worker's, and its ``manager``, :mod:`polyturn.serve.hierarchy`)."""

    name: str
    path: Path
    actor: Actor
    settings: RolloutSettings
    config: TrainConfig
    engine: Engine | VLLMServeEngine
    critic: Any = None  # a SeparateCritic when exploration is gated by value (ExploreSettings.min_value)
    manager: hierarchy.ManagerPolicy | None = None
    created: int = field(default_factory=lambda: int(time.time()))


class ModelNotFound(KeyError):
    """A request named a version that is not loaded (HTTP 404)."""


class TaskStart(NamedTuple):
    """An environment session's new task and its conversation, not yet set on the session."""

    state: ChatState
    obs: str
    seed: int | None
    task: dict[str, Any]
    features: dict[str, float]


def check_engine(config: TrainConfig, engine: str, path: str | os.PathLike[str]) -> None:
    """Refuse a checkpoint the engine cannot serve: ``--engine vllm`` serves flat checkpoints only."""
    if engine == "vllm" and config.hierarchy is not None:
        raise ValueError(f"Expected a flat checkpoint for --engine vllm, got {str(path)!r}, a hierarchical one: its "
                         "manager and worker are two policies that each would need a vLLM server of its own, and "
                         "serving them so is not supported yet; serve it with --engine home")


def inside(path: Path, roots: list[str]) -> bool:
    """Whether ``path`` (resolved, symlinks followed) lies inside one of ``roots``."""
    p = path.resolve()
    return any(p.is_relative_to(Path(r).resolve()) for r in roots)


class Service:
    """Versions, router, sessions, metrics and recorder behind the HTTP routes."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.versions: dict[str, Version] = {}
        self.router: Router | None = None
        self.store = SessionStore(timeout_s=config.session_timeout_s, max_sessions=config.max_sessions)
        self.recorder = Recorder(config.record_dir) if config.record_dir else None
        self.rng = random.Random(config.seed)
        self.ope_gate = None if config.ope is None else OPEGate(
            config.ope, record_dir=config.record_dir, checkpoint=lambda name: self.versions[name].path)

    # ----- versions -------------------------------------------------------------------------------
    def load_version(self, path: str | os.PathLike[str], *, name: str | None = None) -> Version:
        """Load a checkpoint (checkpoint, actor or run directory) and start its engine (a hierarchical one's:
        the worker's, and the manager's)."""
        spec = resolve_policy(str(path))
        if spec.actor_dir is None or spec.config is None:
            raise ValueError(f"Expected a checkpoint directory, got {str(path)!r}")
        name = name or spec.label
        if name in self.versions:
            raise ValueError(f"Expected a new version name, got {name!r}, which is loaded already")
        hierarchy.check_versions([spec], loaded=[(n, v.manager is not None) for n, v in self.versions.items()])
        check_engine(spec.config, self.config.engine, path)
        actor_dir = hierarchy_dirs(spec)[1] if spec.config.hierarchy else spec.actor_dir
        actor = self._load_actor(actor_dir)
        settings = rollout_settings(spec.config)
        m = self.metrics
        engine_cls = UnbatchedEngine if self.config.unbatched else Engine

        def start(actor: Actor, version: str,
                  on_step: Callable[[int, float], None] | None = None) -> Engine | VLLMServeEngine:
            if self.config.engine == "vllm":
                return VLLMServeEngine(actor, settings=settings, version=version, max_rows=self.config.max_sessions,
                                       python=self.config.vllm_python, precision=self.config.precision,
                                       threads=self.config.threads, on_step=on_step).start()
            return engine_cls(actor, settings=settings, version=version, max_rows=self.config.max_sessions,
                              batch_window_s=self.config.batch_window_s, explore=self.config.explore,
                              seed=self.config.seed + len(self.versions), prefill_chunk=self.config.prefill_chunk,
                              on_step=on_step).start()

        engine = start(actor, name, lambda n, dt: (m.batch.labels(name).observe(n), m.step.labels(name).observe(dt)))
        manager = None if spec.config.hierarchy is None else hierarchy.load_manager(
            spec, load=self._load_actor, start=lambda a: start(a, f"{name}/manager"), settings=settings)
        v = Version(name=name, path=Path(path).resolve(), actor=actor, settings=settings, config=spec.config,
                    engine=engine, critic=self._load_critic(actor_dir.parent), manager=manager)
        self.versions[name] = v
        if self.router is None:
            self.router = Router([name], seed=self.config.seed, gate=self.ope_gate,
                                 gate_share=self.config.ope.share if self.config.ope else 0.2)
        else:
            self.router.add_arm(name)
        self.update_share_gauges()
        log.info("loaded version %s from %s", name, path)
        return v

    def _load_actor(self, actor_dir: Path) -> Actor:
        actor = load_actor(actor_dir)
        if self.config.merges_lora:  # nothing trains in the server
            actor.merge_lora()
        return actor.to(self.config.runtime)

    def _load_critic(self, ckpt: Path) -> Any:
        """The checkpoint's separate critic, loaded only when exploration is gated by value."""
        ex = self.config.explore
        if ex.epsilon <= 0 or ex.min_value is None or not (ckpt / "critic" / "critic_config.json").is_file():
            return None
        critic = SeparateCritic.from_pretrained(ckpt / "critic").eval()
        if critic.config.include_privileged and not ex.oracle_critic:
            raise ValueError(
                f"Expected an unprivileged critic for --explore-min-value, got {ckpt / 'critic'}, which reads "
                "privileged text (trained with critic.privileged: true): that information does not exist at "
                "deployment. Serve a checkpoint whose critic was trained with critic.privileged=false, drop "
                "--explore-min-value, or pass --explore-oracle-critic to run it as an oracle experiment."
            )
        if critic.config.include_privileged:
            log.warning("version at %s: exploration gated by a privileged critic (oracle experiment)", ckpt)
        return critic

    def state_value(self, v: Version, s: Session) -> float:
        """The critic's V(s) of the session's current state (its task, turns so far, privileged text, features)."""
        body = [it for it in s.state.items if it[0] != "system"]
        history = [(body[i][1], body[i + 1][1]) for i in range(1, len(body) - 1, 2)
                   if body[i][0] == "action" and body[i + 1][0] == "obs"]
        inp = CriticInput(task=body[0][1], history=history, privileged=s.task.get("privileged") or None,
                          features=s.features or None)
        with torch.no_grad():
            return float(v.critic.values([inp])[0])

    def update_share_gauges(self) -> None:
        """Export the router's shares."""
        assert self.router is not None
        for arm, share in self.router.shares.items():
            self.metrics.share.labels(arm).set(share)

    def version_for(self, model: str | None) -> Version:
        """The version a request names (a loaded version), or the router's choice for ``auto``/``polyturn``/None."""
        assert self.router is not None
        if model in (None, "", "auto", "polyturn"):
            arm = self.router.choose()
            self.update_share_gauges()
            return self.versions[arm]
        if model not in self.versions:
            raise ModelNotFound(f"Expected model 'auto' or a loaded version {sorted(self.versions)}, got {model!r}")
        return self.versions[model]

    def shutdown(self) -> None:
        """Close every session (recording it) and stop the engines."""
        for s in self.store.all():
            self.store.pop(s.id)
            self.finish(s, reason="shutdown")
        for v in self.versions.values():
            v.engine.stop()
            if v.manager is not None:
                v.manager.engine.stop()

    # ----- sessions ---------------------------------------------------------------------------------
    def env_kwargs(self, version: Version, env_id: str, *, files: dict[str, str] | None = None) -> dict[str, Any]:
        """Keyword arguments for ``gymnasium.make``: the checkpoint's, with files only from ``data_dir``.

        ``files`` maps a file kind the env's spec accepts (``EnvSpec.data_files``, e.g. ``database``) to a
        file name inside ``data_dir``; the spec says which constructor keyword takes its path.
        """
        try:
            spec = env_spec(env_id)
        except ValueError as e:
            raise RequestError(f"{e} (or no env for a plain chat)") from None
        kwargs = dict(version.config.env.kwargs) if env_id == version.config.env.id else {}
        for kind, name in (files or {}).items():
            if name is None:
                continue
            if kind not in spec.data_files:
                raise RequestError(f"Expected a file kind that {env_id} opens ({sorted(spec.data_files) or 'none'}), "
                                   f"got {kind!r}")
            key = spec.data_files[kind]
            if not self.config.data_dir:
                raise RequestError(f"Expected no {kind} file: this server has no --data-dir configured")
            p = Path(self.config.data_dir) / name
            if not inside(p, [self.config.data_dir]) or not p.is_file():
                raise RequestError(f"Expected a file name inside the server's data directory, got {name!r}")
            kwargs[key] = str(p.resolve())
        return kwargs

    async def open_session(
        self,
        *,
        env_id: str | None,
        model: str | None,
        temperature: float,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        files: dict[str, str] | None = None,
        seat: tuple[str | None, str | None] = (None, None),
        sample_seed: int | None = None,
    ) -> Session:
        """Route, lease a cache row and (for an env session) start the environment's task.

        A multi-role environment is served from one ``seat``: ``(role, partner)``, the agent's role (default: the
        first) and the scripted partner in the others (default: the first of the env's training partners).
        ``sample_seed`` seeds the agent's sampling (:meth:`agent_turn`)."""
        if len(self.store) >= self.config.max_sessions * max(1, len(self.versions)):
            raise OverflowError(f"Expected room for a new session, got {len(self.store)} live (the limit); "
                                "close idle sessions or retry later")
        v = self.version_for(model)
        env = None
        kwargs = self.env_kwargs(v, env_id, files=files) if env_id else {}
        slot = v.engine.open_slot()
        s = Session(id=self.store.new_id(), kind="env" if env_id else "chat", arm=v.name, slot=slot,
                    state=ChatState(v.actor, v.settings), temperature=temperature, sample_seed=sample_seed)
        try:
            s.hier = None if v.manager is None else hierarchy.SessionHierarchy(v.manager)  # the manager's row
            if env_id:
                env = await asyncio.to_thread(
                    lambda: make_env(env_id, kwargs).unwrapped)
                if s.hier is not None:
                    env = s.hier.env_seat(env, env_id, seat)
                elif is_multi_agent(env):
                    try:
                        env = seated(env, env_id, role=seat[0], partner=seat[1])
                    except ValueError as e:
                        raise RequestError(str(e)) from None
                elif seat != (None, None):
                    raise RequestError(f"Expected role/partner only for a multi-role environment, got {env_id} "
                                       f"with env kwargs {kwargs}")
                s.env, s.env_id = env, env_id
                self._set_task(s, await self._new_task(s, seed=seed, options=options))
        except BaseException as e:
            v.engine.release(slot)
            if s.hier is not None:
                s.hier.close()
            if env is not None:
                env.close()
            if isinstance(e, request_errors(env_id)):
                raise RequestError(str(e)) from None
            raise
        self.store.add(s)
        self.metrics.sessions.labels(v.name).inc()
        return s

    async def _new_task(self, s: Session, *, seed: int | None, options: dict[str, Any] | None) -> TaskStart:
        """Reset the session's environment to a new task and start its conversation (the session is unchanged)."""
        obs, info = await asyncio.to_thread(s.env.reset, seed=seed, options=options or None)
        v = self.versions[s.arm]
        system = s.env.tool_docs() if v.settings.system_prompt else None
        state = ChatState(v.actor, v.settings)
        state.sync(([("system", system)] if system else []) + [("task", obs)])
        task = {k: info.get(k) for k in ("task_id", "question", "level", "ambiguous", "privileged", "key_actions",
                                         "hierarchy")}  # a hierarchical session's game record (WorkerSeat.log)
        return TaskStart(state=state, obs=obs, seed=seed, task=task, features=dict(info.get("features", {})))

    @staticmethod
    def _set_task(s: Session, start: TaskStart) -> None:
        s.state, s.obs, s.seed, s.task, s.features = start.state, start.obs, start.seed, start.task, start.features

    def finish(self, s: Session, *, reason: str) -> None:
        """Clear a session's state (row, environment) and record it when it has turns."""
        v = self.versions.get(s.arm)
        if v is not None:
            v.engine.release(s.slot)
        if s.hier is not None:
            s.hier.close()
        if s.env is not None:
            s.env.close()
            s.env = None
        self.metrics.sessions.labels(s.arm).dec()
        self.metrics.sessions_closed.labels(s.arm, reason).inc()
        self.record(s, reason=reason)

    def count_outcome(self, arm: str, endpoint: str, status: int) -> None:
        """A served request's outcome: an error status in the metrics, and for an agent endpoint a request (a
        5xx an error) in the router's counts, which the ramp's guard reads."""
        if status >= 400:
            self.metrics.errors.labels(arm, endpoint, str(status)).inc()
        if arm and endpoint in AGENT_ENDPOINTS and self.router is not None:
            self.router.record(arm, error=status >= 500)

    def record(self, s: Session, *, reason: str) -> None:
        """Write the session's conversation as an episode record (``--record``)."""
        if self.recorder is not None and s.turns:
            self.recorder.write(s.to_record(end_reason=reason))
            self.metrics.recorded.labels(s.arm).inc()

    def start_over(self, s: Session, *, reason: str) -> None:
        """Record the conversation so far as its own episode and clear its turns, outcome and feedback."""
        self.record(s, reason=reason)
        s.turns, s.done, s.success, s.feedback, s.final_observation = [], False, None, [], ""

    async def reset_session(self, s: Session, *, seed: int | None, options: dict[str, Any] | None) -> None:
        """Record the conversation so far and start over in the same session (new task for an env session).

        The new task starts first: when it cannot (a bad ``task_id`` or ``level``), the :class:`RequestError`
        leaves the session's turns in place and unrecorded.
        """
        v = self.versions[s.arm]
        if s.env is None:
            self.start_over(s, reason="reset")
            s.state, s.task = ChatState(v.actor, v.settings), {}
            if s.hier is not None:
                s.hier.forget()
            return
        try:
            start = await self._new_task(s, seed=seed, options=options)
        except request_errors(s.env_id) as e:
            raise RequestError(str(e)) from None
        self.start_over(s, reason="reset")
        self._set_task(s, start)

    def reap(self) -> int:
        """Expire idle sessions (state cleared, recorded); returns how many."""
        gone = self.store.expired()
        for s in gone:
            log.info("session %s expired after %.0f s idle", s.id, self.store.timeout_s)
            try:
                self.finish(s, reason="expired")
            except Exception:  # e.g. its record cannot be written: the other sessions still expire
                log.exception("session %s: closing it on expiry failed", s.id)
        return len(gone)

    # ----- turns ----------------------------------------------------------------------------------
    async def agent_turn(
        self,
        s: Session,
        *,
        endpoint: str,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        on_token: Callable[[int], None] | None = None,
        seed: int | None = None,
        top_logprobs: int = 0,
    ) -> tuple[TurnResult, str]:
        """Sample the agent's next action for ``s`` (its context already holds the new messages).

        ``seed`` (else the session's ``sample_seed`` plus its turns so far) is the turn's sampling seed, which
        ``--engine vllm`` honours: the same context, temperature and seed give the same action again."""
        v = self.versions[s.arm]
        if seed is None and s.sample_seed is not None:
            seed = (s.sample_seed + len(s.turns)) % 2**31
        ctx, restart = s.state.context()
        cap = v.settings.max_action_tokens if max_tokens is None else min(max_tokens, v.settings.max_action_tokens)
        explore = self.config.explore.epsilon > 0 and self.rng.random() < self.config.explore.epsilon
        if explore and v.critic is not None:
            try:
                value = await asyncio.to_thread(self.state_value, v, s)
            except (ValueError, KeyError, RuntimeError) as e:  # e.g. a feature critic on a chat session
                log.warning("exploration: critic value unavailable (%s); greedy answer kept", e)
                value = float("-inf")
            if value < self.config.explore.min_value:
                log.info("exploration: state value %.3f below %.3f; greedy answer kept", value,
                         self.config.explore.min_value)
                self.metrics.explored.labels(v.name, "low_value").inc()
                explore = False
        req = TurnRequest(slot=s.slot, context=ctx, restart=restart,
                          temperature=s.temperature if temperature is None else temperature,
                          top_p=v.settings.top_p if top_p is None else top_p, max_new_tokens=cap,
                          explore=explore, seed=seed, on_token=on_token, top_logprobs=top_logprobs)
        t0 = time.perf_counter()
        try:
            res: TurnResult = await asyncio.wrap_future(v.engine.submit(req))
        except BaseException:
            s.state.invalidate()
            raise
        res.context, res.restart, res.temperature, res.seed = list(ctx), restart, req.temperature, seed
        m = self.metrics
        m.latency.labels(v.name, endpoint).observe(time.perf_counter() - t0)
        m.queue.labels(v.name).observe(res.queue_s)
        m.tokens.labels(v.name, "prompt").inc(len(ctx))
        m.tokens.labels(v.name, "completion").inc(len(res.ids))
        if res.explored is not None:
            m.explored.labels(v.name, "forced" if res.forced else "kept_greedy").inc()
        text = v.actor.tokenizer.decode(res.ids if res.hit_cap else res.ids[:-1], skip_special_tokens=False)
        return res, text

    def turn_record(self, s: Session, res: TurnResult, text: str, *, observation: str, latency_s: float) -> dict:
        """A recorded turn before any environment step (a chat turn keeps it as is)."""
        parsed = parse_action(text)
        return {
            "observation": observation, "action": text, "reward": 0.0, "reward_terms": {},
            "terminated": False, "truncated": False,
            "info": {"action_type": parsed.tool if isinstance(parsed, ToolCall) else "message",
                     "action_valid": isinstance(parsed, ToolCall), "error": None, "wasted": False, "features": {},
                     "privileged": ""},
            "latency_s": latency_s, "queue_s": res.queue_s, "gen_s": res.decode_s, "n_tokens": len(res.ids),
            "forced": res.forced, "explored": res.explored, "hit_cap": res.hit_cap,
            "action_ids": list(res.ids), "logprobs": [round(x, 6) for x in res.logprobs],
            "context_ids": list(res.context), "context_restart": res.restart, "temperature": res.temperature,
            "seed": res.seed,
        }

    async def env_turns(self, s: Session, *, max_steps: int) -> list[dict]:
        """Run up to ``max_steps`` agent turns in the session's environment (the server runs the tools)."""
        if s.done:
            raise RequestError("Expected an unfinished episode, got a finished one: reset the session or close it")
        out = []
        for _ in range(max_steps):
            t0 = time.perf_counter()
            res, text = await self.agent_turn(s, endpoint="session_turn")
            obs, reward, terminated, truncated, info = await asyncio.to_thread(s.env.step, text)
            turn = self.turn_record(s, res, text, observation=s.obs, latency_s=time.perf_counter() - t0)
            turn.update(reward=float(reward), reward_terms=dict(info.get("reward_terms", {})), **cost_field(info),
                        terminated=bool(terminated), truncated=bool(truncated),
                        info={k: v for k, v in info.items() if k in EVAL_TURN_INFO_KEYS})
            turn["info"]["privileged"] = str(s.task.get("privileged", ""))
            s.state.add_sampled(res.ids, res.logprobs, text=text, hit_cap=res.hit_cap)
            s.turns.append(turn)
            for term, cost in turn.get("cost_terms", {}).items():  # every term's series, 0 included
                self.metrics.costs.labels(s.arm, term).inc(cost)
            out.append({"action": text, "observation": obs, **{k: turn[k] for k in (
                "reward", "terminated", "truncated", "latency_s", "n_tokens", "forced")},
                "tool": turn["info"].get("action_type"), "error": turn["info"].get("error")})
            if terminated or truncated:
                s.done, s.success, s.final_observation = True, bool(info.get("success", False)), obs
                assert self.router is not None
                self.router.record_outcome(s.arm, success=s.success)
                self.router.record_costs(s.arm, episode_costs(s.turns))
                self.metrics.outcomes.labels(s.arm, "success" if s.success else "failure").inc()
                break
            s.state.add_observation(obs)
            s.obs = obs
            s.features = dict(info.get("features", {}))
        return out

    async def chat_turn(self, s: Session, message: str) -> dict:
        """A plain chat session's turn: the user's message in, the agent's action out."""
        if s.hier is not None:
            return await hierarchy.message_turn(self, s, message)
        s.state.sync(with_user_message(s.state.items, message))
        t0 = time.perf_counter()
        res, text = await self.agent_turn(s, endpoint="session_turn")
        s.turns.append(self.turn_record(s, res, text, observation=message, latency_s=time.perf_counter() - t0))
        s.state.add_sampled(res.ids, res.logprobs, text=text, hit_cap=res.hit_cap)
        return {"action": text, "n_tokens": len(res.ids), "forced": res.forced,
                "latency_s": s.turns[-1]["latency_s"]}

    def add_feedback(self, s: Session, feedback: dict[str, Any]) -> None:
        """Attach an outcome or rating to the session (recorded with it; outcomes feed the ramp's guard)."""
        s.feedback.append({**feedback, "t": time.time(), "after_turn": len(s.turns)})
        if feedback.get("outcome") is not None:
            assert self.router is not None
            ok = feedback["outcome"] == "success"
            self.router.record_outcome(s.arm, success=ok)
            self.metrics.outcomes.labels(s.arm, feedback["outcome"]).inc()
