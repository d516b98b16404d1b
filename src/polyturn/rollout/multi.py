"""Batched collection in turn-taking multi-role environments (:class:`~polyturn.envs.multi_agent.MultiAgentEnv`).

Each game seats a policy (an :class:`~polyturn.models.actor.Actor`) or a scripted player in every role
(:class:`Seat`). Every role a policy plays is one conversation, with its own context (the role's own view: its
introduction, then what it is told between its turns) and its own :class:`~polyturn.rollout.types.Episode`; a
scripted player's turns are written by its ``act`` and recorded nowhere.

Rows of a :class:`~polyturn.rollout.generate.BatchDecoder` are (game slot, role) pairs, one decoder per distinct
actor, so a policy that plays both roles of a game (self-play with shared weights) decodes both in one batch. A
decoding round samples the next action of every game whose turn belongs to a policy; each game then steps with
it, and scripted turns are played at once until a policy's turn comes again.

Rewards follow the contract: a step's reward for a role belongs to that role's most recent turn (the last turn of
a role that did not end the game gets the outcome when the other side does); every role's last turn is marked
terminated or truncated when the game ends, and gets the game's ``success`` for its role.

Simplifications against :class:`~polyturn.rollout.collector.Collector`: environments step in this thread, one
after the other (the built-in multi-role env is pure Python and cheap), and the batch is not shrunk to its live
rows at the tail of a collection.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from polyturn.models.actor import Actor
from polyturn.rollout.candidates import action_text
from polyturn.rollout.context import Conversation, RolloutSettings
from polyturn.rollout.generate import BatchDecoder, SampledAction
from polyturn.rollout.types import Episode, Turn


class Player(Protocol):
    """A scripted seat: ``act(role_view, rng) -> action text`` (e.g. Negotiation's scripted players)."""

    name: str

    def act(self, view: Mapping[str, Any], rng: random.Random) -> str: ...


@dataclass(frozen=True)
class Seat:
    """Who plays a role in a game: a policy (``actor``; its turns are sampled and recorded) or a scripted
    ``player``. ``name`` labels it in the other roles' episodes (``Episode.partner``)."""

    name: str
    actor: Actor | None = None
    player: Player | Callable[[], Player] | None = None

    def __post_init__(self) -> None:
        if (self.actor is None) == (self.player is None):
            raise ValueError(f"Expected a seat with an actor or a scripted player (one of them), got {self!r}")


@dataclass
class _Game:
    """One game in progress in a slot."""

    env: Any
    order: int
    seats: dict[str, Seat]
    players: dict[str, Player]  # the scripted seats' players, one fresh object per game (some keep state)
    rng: random.Random  # the scripted players' draws
    intro: dict[str, str]
    info: dict[str, dict]  # each role's latest info (features and privileged text of its next turn)
    inbox: dict[str, list[str]] = field(default_factory=dict)  # what each role was told since its last action
    convs: dict[str, Conversation] = field(default_factory=dict)
    episodes: dict[str, Episode] = field(default_factory=dict)
    last: dict[str, Turn] = field(default_factory=dict)  # each role's most recent turn
    rows: dict[str, int] = field(default_factory=dict)  # each policy role's row in its actor's decoder
    over: bool = False


def _scripted(seat: Seat) -> Player:
    player = seat.player
    # A factory (a class, or a function that makes a player) gives each game a fresh player: some keep state.
    return player() if isinstance(player, type) or not hasattr(player, "act") else player  # type: ignore


class MultiAgentCollector:
    """Plays games in a list of multi-role environments; returns each game's episodes of its policy seats.

    ``settings`` are the rollout settings of every policy (context budget, action cap, system prompt).
    """

    def __init__(self, envs: Sequence[Any], *, env_id: str, settings: RolloutSettings) -> None:
        if not envs:
            raise ValueError("Expected at least one environment, got none")
        self.envs = [e.unwrapped for e in envs]
        self.roles = tuple(self.envs[0].roles)
        if not self.roles:
            raise ValueError(f"Expected a multi-role environment, got {type(self.envs[0]).__name__} with no roles")
        self.env_id = env_id
        self.settings = settings
        #: The policy version recorded on every turn sampled from now on.
        self.version = 0
        #: Rows of each actor's decoder in the last collection, by the name of a seat it played.
        self.decoder_rows: dict[str, int] = {}

    # ---- one game -----------------------------------------------------------------------------
    def _start(self, env: Any, order: int, game: dict, temperature: float) -> _Game:
        seats: dict[str, Seat] = game["seats"]
        missing = set(self.roles) - set(seats)
        if missing:
            raise ValueError(f"Expected a seat for every role {self.roles}, got none for {sorted(missing)}")
        starts = env.reset(seed=game.get("seed"), options=game.get("options"))
        g = _Game(env=env, order=order, seats=seats,
                  players={r: _scripted(s) for r, s in seats.items() if s.actor is None},
                  rng=random.Random(f"polyturn-seat-{game.get('seed')}"),
                  intro={r: starts[r][0] for r in self.roles}, info={r: dict(starts[r][1]) for r in self.roles},
                  inbox={r: [] for r in self.roles})
        for r, s in seats.items():
            if s.actor is None:
                continue
            info = g.info[r]
            others = ", ".join(seats[o].name for o in self.roles if o != r)
            g.episodes[r] = Episode(
                env_id=self.env_id, seed=game.get("seed"), task_id=str(info.get("task_id", "")),
                question=str(info.get("question", g.intro[r])), level=int(info.get("level", 0)),
                ambiguous=bool(info.get("ambiguous", False)), key_actions=list(info.get("key_actions", [])),
                temperature=temperature, policy=s.name, role=r, partner=others)
        return g

    def _apply(self, g: _Game, text: str, act: SampledAction | None, *, seen: str, decode_s: float,
               gen_s: float = 0.0) -> None:
        """Step ``g`` with the acting role's ``text`` (``act``: the sampled ids, for a policy's turn)."""
        role = g.env.agent_selection
        before = g.info[role]
        t = time.perf_counter()
        ms = g.env.step(text)
        step_s = time.perf_counter() - t
        if act is not None:
            ep = g.episodes[role]
            turn = Turn(observation=seen, action=text, action_ids=list(act.ids), logprobs=list(act.logprobs),
                        reward=0.0, reward_terms={}, terminated=False, truncated=False,
                        info=dict(ms.updates[role].info), privileged=str(before.get("privileged", "")),
                        features=dict(before.get("features", {})), forced=act.forced, hit_cap=act.hit_cap,
                        latency_s=decode_s + step_s, gen_s=gen_s, version=self.version,
                        cost_terms=dict(ms.updates[role].info.get("cost_terms", {})))  # its own step's costs
            g.convs[role].add_action(act.ids, act.logprobs, turn=len(ep.turns), text=text)
            ep.turns.append(turn)
            g.last[role] = turn
        ended = ms.terminated or ms.truncated
        for r, up in ms.updates.items():
            if up.observation is not None:
                g.inbox[r].append(up.observation)
            g.info[r] = dict(up.info)
            last = g.last.get(r)
            if last is None:
                continue
            last.reward += float(up.reward)
            for k, v in up.reward_terms.items():
                last.reward_terms[k] = last.reward_terms.get(k, 0.0) + float(v)
            if ended:
                last.terminated, last.truncated = bool(ms.terminated), bool(ms.truncated)
                if r != role:  # the outcome of a game another role ended
                    last.info = {**last.info, **{k: v for k, v in up.info.items() if k in ("success", "deal")}}
        if ended:
            g.over = True
            for r, ep in g.episodes.items():
                ep.final_observation = "\n".join(g.inbox[r])
                ep.final_features = dict(g.info[r].get("features", {}))
                ep.final_privileged = str(g.info[r].get("privileged", ""))
                if ms.truncated and not ms.terminated and r in g.convs:
                    # The state after the last turn, for critics that read the actor's context (as Collector).
                    g.convs[r].add_observation(ep.final_observation, close_action=g.last[r].hit_cap)

    def _play_scripted(self, g: _Game) -> None:
        """Play the scripted seats' turns until a policy's turn comes or the game ends."""
        while not g.over and g.seats[g.env.agent_selection].actor is None:
            role = g.env.agent_selection
            g.inbox[role] = []
            self._apply(g, g.players[role].act(g.env.role_view(role), g.rng), None, seen="", decode_s=0.0)

    def _context(self, g: _Game, role: str) -> tuple[list[int], bool, str]:
        """The role's tokens to append before it acts (all of them when its row restarts: the second value), and
        the text it was shown."""
        told = "\n".join(g.inbox[role])
        g.inbox[role] = []
        conv = g.convs.get(role)
        if conv is None:  # the role's first turn: its introduction and what it was told before it
            seen = g.intro[role] + ("\n" + told if told else "")
            actor = g.seats[role].actor
            system = g.env.tool_docs(role) if self.settings.system_prompt else None
            conv = g.convs[role] = Conversation(actor, self.settings, task=seen, system=system)
            g.episodes[role].segments = conv.segments
            return list(conv.seg.ids), True, seen
        last = g.last[role]
        pieces = conv.add_observation(told, close_action=last.hit_cap)
        if conv.needs_rebuild():  # over the context budget: the row starts over, shortened
            conv.rebuild()
            return list(conv.seg.ids), True, told
        return pieces, False, told

    # ---- many games ---------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, games: Sequence[dict], *, temperature: float, epsilon: float = 0.0,
                rng: np.random.Generator | None = None, generator: torch.Generator | None = None,
                progress: Callable[[int], None] | None = None) -> list[dict[str, Episode]]:
        """Play every game (``{"seed", "options", "seats": {role: Seat}}``) to its end; each game's episodes of
        its policy seats by role, in game order. ``epsilon``: the chance per policy turn that a random valid
        action replaces the sampled one (marked ``forced``, with the policy's log-probs of its ids)."""
        rng = rng or np.random.default_rng(0)
        s = self.settings
        actors: dict[int, Actor] = {}
        for game in games:
            for seat in game["seats"].values():
                if seat.actor is not None:
                    actors.setdefault(id(seat.actor), seat.actor)
        # A decoder holds a row (a KV cache of context_budget columns, and a row of every forward) per seat its
        # actor can play at once: no more than its seats in all the games, nor than each slot times the most roles
        # it plays in one game. A pool partner seated in a few games gets a few rows, not one per (slot, role):
        # with SmolLM2, 48 slots and a pool of 4, a row per (slot, role) in every decoder held 11 GB of caches and
        # ran 96-row forwards for 2-4 live rows; and the hierarchy's manager and worker, one role a game each, got
        # 96 rows each where 48 are ever used (2 x 4.2 GB of bf16 caches reserved, every row zeroed as the width
        # grew; the evaluation of runs/cs_hier_smol_s1 was killed for memory at 18 GB, 2026-12-08). Rows are taken
        # smallest first when a game starts and given back when it ends.
        in_game = [Counter(id(s.actor) for s in game["seats"].values() if s.actor is not None) for game in games]
        seats = sum(in_game, Counter())
        size = {k: min(seats[k], len(self.envs) * max(c[k] for c in in_game)) for k in actors}
        names = {id(seat.actor): seat.name for game in games for seat in game["seats"].values() if seat.actor}
        self.decoder_rows = {names[k]: n for k, n in size.items()}
        decoders = {k: BatchDecoder(a.model, pad_id=a.pad_id, stop_id=a.stop_id, autocast=a.autocast,
                                    capacity=s.context_budget) for k, a in actors.items()}
        for k, dec in decoders.items():
            dec.reset([[actors[k].pad_id]] * size[k])
        free = {k: list(range(size[k])) for k in actors}  # heaps of each decoder's unused rows
        queue = list(enumerate(games))
        results: dict[int, dict[str, Episode]] = {}
        slots: list[_Game | None] = [None] * len(self.envs)

        def fill(i: int) -> None:
            while queue:
                order, game = queue.pop(0)
                g = self._start(self.envs[i], order, game, temperature)
                self._play_scripted(g)
                if not g.over:
                    g.rows = {r: heapq.heappop(free[id(seat.actor)]) for r, seat in g.seats.items()
                              if seat.actor is not None}
                    slots[i] = g
                    return
                self._finish(g, results, progress)
            slots[i] = None

        for i in range(len(self.envs)):
            fill(i)
        while any(slots):
            pieces = {k: [[] for _ in range(size[k])] for k in decoders}
            turns: dict[int, tuple[int, str, int, str]] = {}  # slot -> (decoder key, role, row, text seen)
            for i, g in enumerate(slots):
                if g is None:
                    continue
                role = g.env.agent_selection
                key, row = id(g.seats[role].actor), g.rows[role]
                ids, restart, seen = self._context(g, role)
                if restart:
                    decoders[key].restart_row(row)
                pieces[key][row] = ids
                turns[i] = (key, role, row, seen)
            acts: dict[int, tuple[SampledAction, float, float]] = {}
            for key, dec in decoders.items():
                mine = {i: t for i, t in turns.items() if t[0] == key}
                if not mine:
                    continue
                t0 = time.perf_counter()
                dec.append(pieces[key])
                active = [False] * len(pieces[key])
                forced: list[list[int] | None] = [None] * len(pieces[key])
                for i, (_, _, row, _) in mine.items():
                    active[row] = True
                    if epsilon > 0 and rng.random() < epsilon:
                        text = slots[i].env.sample_valid_action(rng)
                        actor = actors[key]
                        forced[row] = actor.encode(text)[: s.max_action_tokens - 1] + [actor.stop_id]
                out = dec.sample(active=active, temperature=temperature, top_p=s.top_p,
                                 max_new_tokens=s.max_action_tokens, forced=forced, generator=generator)
                decode_s = time.perf_counter() - t0
                step_tokens = sum(len(out[row].ids) for _, _, row, _ in mine.values()) or 1
                for i, (_, _, row, _) in mine.items():  # each turn's share of the step: its share of the tokens
                    acts[i] = (out[row], decode_s, decode_s * len(out[row].ids) / step_tokens)
            for i in sorted(acts):
                g = slots[i]
                key, role, _, seen = turns[i]
                act, decode_s, gen_s = acts[i]
                self._apply(g, action_text(actors[key], act), act, seen=seen, decode_s=decode_s, gen_s=gen_s)
                self._play_scripted(g)
                if g.over:
                    for r, row in g.rows.items():
                        decoders[id(g.seats[r].actor)].restart_row(row)
                        heapq.heappush(free[id(g.seats[r].actor)], row)
                    self._finish(g, results, progress)
                    fill(i)
        return [results[k] for k in sorted(results)]

    @staticmethod
    def _finish(g: _Game, results: dict[int, dict[str, Episode]], progress: Callable[[int], None] | None) -> None:
        results[g.order] = g.episodes
        if progress:
            progress(1)
