"""Batched multi-turn collection: many environments, one actor, continuous batching.

Each batch slot runs one conversation; when it ends, the slot takes the next
task at once (its cache row restarts, :meth:`BatchDecoder.restart_row`), so
short episodes do not leave the batch half empty. Contexts follow the context
policy of :mod:`polyturn.rollout.context`; a rebuilt context restarts its row
alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from polyturn.models.actor import Actor
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.best_of import pick_best
from polyturn.rollout.candidates import action_text, sample_candidates
from polyturn.rollout.context import Conversation, RolloutSettings
from polyturn.rollout.generate import BatchDecoder, SampledAction
from polyturn.rollout.types import Episode, Turn
from polyturn.rollout.vllm_decoder import VLLMDecoder
from polyturn.rollout.vllm_engine import VLLMEngine
from polyturn.rollout.vllm_server import VLLMError

__all__ = ["Collector", "RolloutSettings"]


@dataclass
class _Slot:
    env: Any
    episode: Episode
    conv: Conversation
    obs: str
    info: dict
    #: Action ids the first turns follow instead of sampling (a branch replaying another episode's prefix).
    prefix: Sequence[Sequence[int]] = ()


class Collector:
    """Runs an :class:`Actor` in a list of environments and returns finished :class:`Episode` s."""

    def __init__(self, actor: Actor, envs: Sequence[Any], *, env_id: str, settings: RolloutSettings,
                 reuse_cache: bool = True, env_threads: int = 1, best_of: int = 1,
                 scorer: Callable[[Sequence[CriticInput]], Sequence[float]] | None = None,
                 vllm: VLLMEngine | None = None) -> None:
        """``vllm``: a started vLLM engine samples the actions (``rollout.engine = vllm``) instead of the home
        engine (:class:`BatchDecoder` on ``actor``'s model), through the same decoder interface, each collection
        on the actor's current weights (:meth:`VLLMEngine.sync`);
        ``reuse_cache=False`` re-encodes every history each turn (the baseline of ``benchmarks/rollout.py``);
        ``env_threads > 1`` steps a round's environments concurrently (SQLite releases the GIL);
        ``best_of > 1`` samples that many candidate turns per state and plays the one ``scorer`` (an action
        critic) rates highest, recording its ids and behaviour log-probs (candidates are sampled at
        temperature 1 when decoding is greedy)."""
        if best_of < 1 or (best_of > 1 and scorer is None):
            raise ValueError(f"Expected best_of >= 1, and a scorer when best_of > 1; got best_of={best_of}, "
                             f"scorer={scorer!r}")
        self.best_of = best_of
        self.scorer = scorer
        if vllm is not None and best_of > 1:
            raise ValueError("Expected rollout.best_of = 1 with rollout.engine = vllm (candidates are sampled by the "
                             f"home engine), got best_of = {best_of}")
        self.vllm = vllm
        if not envs:
            raise ValueError("Expected at least one environment, got none")
        if env_threads < 1:
            raise ValueError(f"Expected env_threads >= 1, got {env_threads}")
        self.actor = actor
        self.envs = list(envs)
        self.env_id = env_id
        self.settings = settings
        self.reuse_cache = reuse_cache
        self.env_threads = env_threads
        self._pool = ThreadPoolExecutor(env_threads, thread_name_prefix="polyturn-env") if env_threads > 1 else None
        #: The policy version recorded on every turn sampled from now on (rollout workers set it).
        self.version = 0
        #: Called before each decoding round; a rollout worker installs weights that arrived mid-collection here.
        self.on_round: Callable[[], None] | None = None

    @staticmethod
    def _timed_step(env: Any, text: str) -> tuple[tuple, float]:
        """``env.step(text)`` and its seconds."""
        t = time.perf_counter()
        out = env.step(text)
        return out, time.perf_counter() - t

    def _start(self, env: Any, task: dict, temperature: float, policy: str) -> _Slot:
        obs, info = env.reset(seed=task.get("seed"), options=task.get("options"))
        system = env.unwrapped.tool_docs() if self.settings.system_prompt else None
        ep = Episode(
            env_id=self.env_id,
            seed=task.get("seed"),
            task_id=str(info.get("task_id", "")),
            question=str(info.get("question", obs)),
            level=int(info.get("level", 0)),
            ambiguous=bool(info.get("ambiguous", False)),
            key_actions=list(info.get("key_actions", [])),
            temperature=temperature,
            policy=policy,
        )
        conv = Conversation(self.actor, self.settings, task=obs, system=system)
        ep.segments = conv.segments  # the same list: segments added by the context policy land in the episode
        return _Slot(env=env, episode=ep, conv=conv, obs=obs, info=info, prefix=task.get("prefix", ()))

    def _best_candidates(self, slots: Sequence[_Slot | None], forced: list[list[int] | None], *, temperature: float,
                         generator: torch.Generator | None) -> dict[int, SampledAction]:
        """Best-of-n: per live, unforced row, the critic's favourite of ``best_of`` sampled candidates."""
        rows = [i for i, sl in enumerate(slots) if sl is not None and forced[i] is None]
        if not rows:
            return {}
        cands = sample_candidates(self.actor, [slots[i].conv.seg.ids for i in rows], k=self.best_of,
                                  temperature=temperature if temperature > 0 else 1.0, top_p=self.settings.top_p,
                                  max_new_tokens=self.settings.max_action_tokens, generator=generator)
        inputs = []
        for i, acts in zip(rows, cands):
            sl, t = slots[i], len(slots[i].episode.turns)
            history = sl.episode.history(t)
            if history:  # the last turn's answer is the current observation (no next turn holds it yet)
                history[-1] = (history[-1][0], sl.obs)
            inputs += [CriticInput(task=sl.episode.question, history=history,
                                   privileged=str(sl.info.get("privileged", "")), features=dict(sl.info.get("features", {})),
                                   action=action_text(self.actor, a)) for a in acts]
        scores = list(self.scorer(inputs))
        out, k = {}, 0
        for i, acts in zip(rows, cands):
            out[i] = acts[pick_best(scores[k : k + len(acts)])]
            k += len(acts)
        return out

    @torch.no_grad()
    def collect(
        self,
        tasks: Sequence[dict],
        *,
        temperature: float,
        epsilon: float = 0.0,
        rng: np.random.Generator | None = None,
        generator: torch.Generator | None = None,
        progress: Callable[[int], None] | None = None,
        policy: str = "actor",
    ) -> list[Episode]:
        """Play every task (``{"seed": int, "options": dict}``) to its end; episodes come back in task order.

        A task's optional ``"prefix"`` (a list of action-id lists) is played first, turn by turn, as forced
        actions (a branch from another episode's state: :mod:`polyturn.rollout.branches`); then the policy samples.

        ``epsilon`` is the chance, per turn, that the sampled action is replaced
        by a random valid one from the environment (exploration); such turns
        are marked ``forced`` and carry the policy's log-probs of the forced ids.

        With ``rollout.engine = vllm``, a vLLM server that dies during the collection is started again once and
        every task is played again from its start (the episodes of the first try are dropped, as a dead Ray
        worker's are); a second death, or a server that refused a request, is a :class:`VLLMError`.
        """
        kw = dict(temperature=temperature, epsilon=epsilon, rng=rng, generator=generator, progress=progress,
                  policy=policy)
        if self.vllm is None:
            return self._collect(tasks, **kw)
        try:
            return self._collect(tasks, **kw)
        except VLLMError:
            if self.vllm.server.proc is not None and self.vllm.server.proc.poll() is None:
                raise  # the server lives: it refused the request, and would again
            self.vllm.restart()
            return self._collect(tasks, **kw)

    def _collect(self, tasks: Sequence[dict], *, temperature: float, epsilon: float,
                 rng: np.random.Generator | None, generator: torch.Generator | None,
                 progress: Callable[[int], None] | None, policy: str) -> list[Episode]:
        rng = rng or np.random.default_rng(0)
        actor, s = self.actor, self.settings
        queue = list(enumerate(tasks))
        results: dict[int, Episode] = {}
        slots: list[_Slot | None] = [None] * len(self.envs)
        order = [-1] * len(self.envs)
        for i, env in enumerate(self.envs):
            if queue:
                order[i], task = queue.pop(0)
                slots[i] = self._start(env, task, temperature, policy)
        if not any(slots):
            return []
        if self.vllm is not None:
            self.vllm.sync(actor)
        dec = (VLLMDecoder(self.vllm.server, pad_id=actor.pad_id, stop_id=actor.stop_id) if self.vllm is not None else
               BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id, autocast=actor.autocast,
                            capacity=self.settings.context_budget))

        def contexts() -> list[list[int]]:
            return [sl.conv.seg.ids if sl else [actor.pad_id] for sl in slots]

        dec.reset(contexts())
        pieces: list[list[int]] = []
        while any(slots):
            if self.on_round is not None:
                self.on_round()
            t0 = time.perf_counter()
            for i, sl in enumerate(slots if pieces else []):
                if sl and sl.conv.needs_rebuild():  # over the context budget: the row starts over, shortened
                    sl.conv.rebuild()
                    dec.restart_row(i)
                    pieces[i] = list(sl.conv.seg.ids)
            if pieces and self.reuse_cache:
                dec.append(pieces)  # last round's forced tokens (end of action, next observation)
            elif pieces:
                dec.reset(contexts())  # the re-encoding baseline
            forced: list[list[int] | None] = [None] * len(slots)
            for i, sl in enumerate(slots):
                if sl and len(sl.episode.turns) < len(sl.prefix):
                    forced[i] = list(sl.prefix[len(sl.episode.turns)])
            if epsilon > 0:
                for i, sl in enumerate(slots):
                    if sl and forced[i] is None and rng.random() < epsilon:
                        text = sl.env.unwrapped.sample_valid_action(rng)
                        forced[i] = actor.encode(text)[: s.max_action_tokens - 1] + [actor.stop_id]
            best: dict[int, SampledAction] = {}
            if self.best_of > 1:
                best = self._best_candidates(slots, forced, temperature=temperature, generator=generator)
                for i, act in best.items():
                    forced[i] = act.ids  # the decoder follows the chosen ids (its KV cache then holds them)
            texts: dict[int, str] = {}
            steps: dict[int, Future] = {}

            def start_step(i: int, act: SampledAction) -> None:
                # A row's action is done while others still decode: step its env in a thread meanwhile.
                texts[i] = action_text(actor, act)
                steps[i] = self._pool.submit(self._timed_step, slots[i].env, texts[i])

            acts = dec.sample(
                on_done=start_step if self._pool is not None else None,
                active=[sl is not None for sl in slots],
                temperature=temperature,
                top_p=s.top_p,
                max_new_tokens=s.max_action_tokens,
                forced=forced,
                generator=generator,
            )
            for i, act in best.items():
                acts[i] = act  # the candidate as sampled: its own behaviour log-probs, not marked forced
            decode_s = time.perf_counter() - t0
            step_tokens = sum(len(a.ids) for a in acts if a is not None) or 1
            pieces = [[] for _ in slots]
            for i, (sl, act) in enumerate(zip(slots, acts)):
                if sl is not None and act is not None and i not in texts:
                    texts[i] = action_text(actor, act)
            for i, (sl, act) in enumerate(zip(slots, acts)):
                if sl is None or act is None:
                    continue
                text = texts[i]
                stepped = steps[i].result() if i in steps else self._timed_step(sl.env, text)
                (obs, reward, terminated, truncated, info), step_s = stepped
                turn_idx = len(sl.episode.turns)
                sl.episode.turns.append(
                    Turn(
                        observation=sl.obs,
                        action=text,
                        action_ids=list(act.ids),
                        logprobs=list(act.logprobs),
                        reward=float(reward),
                        reward_terms=dict(info.get("reward_terms", {})),
                        cost_terms=dict(info.get("cost_terms", {})),
                        terminated=bool(terminated),
                        truncated=bool(truncated),
                        info=info,
                        privileged=str(sl.info.get("privileged", "")),
                        features=dict(sl.info.get("features", {})),
                        forced=act.forced,
                        hit_cap=act.hit_cap,
                        latency_s=decode_s + step_s,
                        gen_s=decode_s * len(act.ids) / step_tokens,
                        version=self.version,
                    )
                )
                sl.conv.add_action(act.ids, act.logprobs, turn=turn_idx, text=text)
                if terminated or truncated:
                    ep = sl.episode
                    ep.final_observation = obs
                    ep.final_features = dict(info.get("features", {}))
                    ep.final_privileged = str(info.get("privileged", ""))
                    if truncated and not terminated:
                        # The state after the last turn, for critics that read the actor's context.
                        sl.conv.add_observation(obs, close_action=act.hit_cap)
                    results[order[i]] = ep
                    if progress:
                        progress(1)
                    dec.restart_row(i)
                    if queue:
                        order[i], task = queue.pop(0)
                        slots[i] = self._start(self.envs[i], task, temperature, policy)
                        pieces[i] = list(slots[i].conv.seg.ids)
                    else:
                        slots[i] = None
                        pieces[i] = [actor.pad_id]
                    continue
                pieces[i] = sl.conv.add_observation(obs, close_action=act.hit_cap)
                sl.obs, sl.info = obs, info
            live = [i for i, sl in enumerate(slots) if sl is not None]
            if not queue and live and len(live) <= len(slots) // 2:
                # The tail of a collection: shrink the batch to its live rows.
                dec.keep_rows(live)
                slots, order, pieces = [slots[i] for i in live], [order[i] for i in live], [pieces[i] for i in live]
        return [results[k] for k in sorted(results)]
