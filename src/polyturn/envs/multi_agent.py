"""Turn-taking multi-role text environments: the contract, its checker, and :func:`is_multi_agent`.

A :class:`MultiAgentEnv` is PettingZoo's AEC model in text: ``roles`` name the
players, :attr:`MultiAgentEnv.agent_selection` says whose turn it is, and each
:meth:`MultiAgentEnv.step` takes that role's ReAct action (as ``ToolEnv.step``
does) and returns a :class:`MultiStep` with one :class:`RoleUpdate` per role:
what the role is told, the reward for its most recent action, and its info.

What a collector relies on:

* A role's text before an action: its reset observation at its first action,
  else the non-None observations of the updates it received since its own last
  action, joined with ``"\\n"`` in order (the collector joins them).
* A step's rewards for a role belong to that role's most recent action; a role
  that has not acted yet is given no reward.
* An invalid action (unparseable, unknown tool, bad args) is answered to the
  acting role, counts as its turn, and the same role acts again.
* ``max_turns`` counts each role's own turns; the game is truncated when the
  role to act next has none left.
* After the end, ``step`` raises; ``reset`` starts a new game. Everything is
  deterministic given the seed and the actions.

The class subclasses ``gymnasium.Env`` only so that ``gymnasium.make`` can
build and wrap it (``env.unwrapped`` is the multi-role env); its ``reset`` and
``step`` have their own signatures, so make it with
``polyturn.acting.registry.make_env`` or ``gymnasium.make(...,
disable_env_checker=True)``: Gymnasium's passive checker expects the
single-agent API. :func:`check_multi_agent_env` checks this contract instead,
as Gymnasium's ``check_env`` and PettingZoo's ``api_test`` do.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium
from gymnasium.utils import seeding

#: Keys every role's reset info has (ToolEnv.reset's, plus the role).
RESET_INFO_KEYS = ("task_id", "question", "level", "ambiguous", "key_actions", "features", "privileged", "role")
#: Keys the acting role's step info has (as ToolEnv.step's info).
ACTOR_INFO_KEYS = ("action_type", "action_valid", "error")


@dataclass
class RoleUpdate:
    """What one role is told by a step (or by reset).

    ``info`` always has ``"features"`` (``dict[str, float]``, the same keys for the env every time)
    and ``"privileged"`` (this role's privileged text: what the role cannot see). The acting role's
    info also has what ``ToolEnv.step``'s info has (``"action_type"``, ``"action_valid"``,
    ``"error"``, ``"wasted"``); at the end of a game every role's info has ``"success"`` (bool).
    """

    observation: str | None = None  # text the role reads before its next action; None: nothing new
    reward: float = 0.0  # reward for this role's most recent action from this step
    reward_terms: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class MultiStep:
    """The result of one :meth:`MultiAgentEnv.step`: an update for every role, and how the game stands."""

    updates: dict[str, RoleUpdate]
    terminated: bool
    truncated: bool


class MultiAgentEnv(gymnasium.Env):
    """Base of turn-taking multi-role text envs (see the module docstring for the contract).

    Subclasses set ``roles`` and implement every method below; ``reset`` seeds ``np_random``
    (call ``super().reset(seed=seed)`` first, as with ``gymnasium.Env``).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    roles: tuple[str, ...] = ()

    @property
    def agent_selection(self) -> str:
        """The role whose turn it is (PettingZoo AEC's name)."""
        raise NotImplementedError

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
        """Start a game: each role's first observation (its task introduction) and info.

        The info has :data:`RESET_INFO_KEYS` (``ToolEnv.reset``'s keys plus ``"role"``). This base
        only seeds ``np_random``.
        """
        super().reset(seed=seed)
        return {}

    def step(self, action: str) -> MultiStep:  # type: ignore[override]
        """``agent_selection`` (before the call) writes ``action`` (a ReAct text, as ``ToolEnv.step`` takes)."""
        raise NotImplementedError

    def tool_docs(self, role: str) -> str:
        """The system prompt text for ``role``."""
        raise NotImplementedError

    def sample_valid_action(self, rng: Any) -> str:
        """A random valid action for ``agent_selection`` (epsilon exploration); ``rng``: a numpy Generator."""
        raise NotImplementedError

    def role_view(self, role: str) -> Mapping[str, Any]:
        """``role``'s structured private state, for scripted players."""
        raise NotImplementedError


def is_multi_agent(env: gymnasium.Env) -> bool:
    """Whether ``env`` (or the env it wraps) is a :class:`MultiAgentEnv`."""
    return isinstance(env.unwrapped, MultiAgentEnv)


class SeatedEnv(gymnasium.Env):
    """One seat of a :class:`MultiAgentEnv` as a single-agent text env, the other seats filled by scripted players.

    ``reset`` plays the other seats until ``role``'s turn and returns its text (its introduction and what it was
    told before it acts); ``step`` writes the role's action, plays the others until its turn comes again or the
    game ends, and returns what it was told meanwhile, the reward of its action (its own step's and what the
    others' steps gave it), and the game's end. So a policy trained in self-play is evaluated and served in either
    seat through the single-agent paths (``polyturn serve`` env sessions, :class:`~polyturn.rollout.collector.
    Collector`).

    Args:
        env: the multi-role env.
        role: the seat the single agent plays.
        partners: every other role -> a scripted player (``act(role_view, rng) -> action text``; one per game:
            a callable that makes a fresh player is called at each reset).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, env: MultiAgentEnv, *, role: str, partners: Mapping[str, Any]) -> None:
        self.env = env.unwrapped
        if role not in self.env.roles:
            raise ValueError(f"Expected a role among {self.env.roles}, got {role!r}")
        others = set(self.env.roles) - {role}
        if set(partners) != others:
            raise ValueError(f"Expected a scripted partner for each other role {sorted(others)}, got "
                             f"{sorted(partners)}")
        self.role, self.partners = role, dict(partners)
        self._players: dict[str, Any] = {}
        self._rng = random.Random(0)
        self._told: list[str] = []
        self._info: dict[str, Any] = {}

    def tool_docs(self) -> str:
        """The seat's system prompt text."""
        return self.env.tool_docs(self.role)

    def sample_valid_action(self, rng: Any) -> str:
        """A random valid action for the seat (it is always the seat's turn between calls)."""
        return self.env.sample_valid_action(rng)

    def _play_others(self) -> tuple[float, dict[str, float], bool, bool]:
        """The other seats' turns until the seat's or the end: the seat's reward from them, and the end."""
        reward, terms = 0.0, {}
        while self.env.agent_selection != self.role:
            other = self.env.agent_selection
            ms = self.env.step(self._players[other].act(self.env.role_view(other), self._rng))
            r, t = self._take(ms)
            reward += r
            for k, v in t.items():
                terms[k] = terms.get(k, 0.0) + v
            if ms.terminated or ms.truncated:
                return reward, terms, ms.terminated, ms.truncated
        return reward, terms, False, False

    def _take(self, ms: MultiStep) -> tuple[float, dict[str, float]]:
        up = ms.updates[self.role]
        if up.observation is not None:
            self._told.append(up.observation)
        self._info = {**self._info, **up.info}
        return float(up.reward), dict(up.reward_terms)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        starts = self.env.reset(seed=seed, options=options)
        self._players = {r: p() if isinstance(p, type) or not hasattr(p, "act") else p
                         for r, p in self.partners.items()}
        self._rng = random.Random(f"polyturn-seat-{seed}")
        intro, self._info = starts[self.role][0], dict(starts[self.role][1])
        self._told = []
        self._play_others()  # nothing is paid to a seat before its first action
        return "\n".join([intro, *self._told]), dict(self._info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:  # type: ignore[override]
        self._told = []
        self._info = {}
        ms = self.env.step(action)
        reward, terms = self._take(ms)
        terminated, truncated = ms.terminated, ms.truncated
        if not (terminated or truncated):
            r, t, terminated, truncated = self._play_others()
            reward += r
            for k, v in t.items():
                terms[k] = terms.get(k, 0.0) + v
        return "\n".join(self._told), reward, terminated, truncated, {**self._info, "reward_terms": terms}

    def close(self) -> None:
        self.env.close()


# ----- the checker ------------------------------------------------------------------------------
def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def _check_features(features: Any, where: str, keys: set[str] | None) -> set[str]:
    _expect(isinstance(features, dict), f"Expected {where} info['features'] as a dict, got {type(features).__name__}")
    for name, value in features.items():
        _expect(isinstance(name, str) and isinstance(value, float) and math.isfinite(value),
                f"Expected {where} features as str -> finite float, got {name!r}: {value!r}")
    if keys is not None:
        _expect(set(features) == keys, f"Expected {where} features with the keys {sorted(keys)}, "
                                       f"got {sorted(features)}")
    return set(features)


def _check_reset(env: MultiAgentEnv, out: Any, keys: set[str] | None) -> set[str]:
    roles = env.roles
    _expect(isinstance(out, dict) and set(out) == set(roles),
            f"Expected reset() to return a dict with every role {roles}, got "
            f"{sorted(out) if isinstance(out, dict) else type(out).__name__}")
    for role, pair in out.items():
        _expect(isinstance(pair, tuple) and len(pair) == 2,
                f"Expected reset()[{role!r}] as an (observation, info) tuple, got {pair!r}"[:300])
        obs, info = pair
        _expect(isinstance(obs, str) and bool(obs), f"Expected role {role!r}'s reset observation as a non-empty "
                                                    f"str, got {obs!r}"[:300])
        _expect(isinstance(info, dict), f"Expected role {role!r}'s reset info as a dict, got {type(info).__name__}")
        missing = [k for k in RESET_INFO_KEYS if k not in info]
        _expect(not missing, f"Expected role {role!r}'s reset info to have {list(RESET_INFO_KEYS)}, got no {missing}")
        _expect(info["role"] == role, f"Expected reset info['role'] == {role!r}, got {info['role']!r}")
        _expect(isinstance(info["privileged"], str),
                f"Expected role {role!r}'s info['privileged'] as str, got {type(info['privileged']).__name__}")
        keys = _check_features(info["features"], f"role {role!r}'s reset", keys)
    _check_selection(env)
    return keys  # type: ignore[return-value]


def _check_selection(env: MultiAgentEnv) -> None:
    _expect(env.agent_selection in env.roles,
            f"Expected agent_selection among the roles {env.roles}, got {env.agent_selection!r}")


def _check_step(out: Any, roles: tuple[str, ...], actor: str, acted: set[str], keys: set[str]) -> None:
    _expect(isinstance(out, MultiStep), f"Expected step() to return a MultiStep, got {type(out).__name__}")
    _expect(isinstance(out.updates, dict) and set(out.updates) == set(roles),
            f"Expected an update for every role {roles}, got "
            f"{sorted(out.updates) if isinstance(out.updates, dict) else type(out.updates).__name__}")
    for name in ("terminated", "truncated"):
        value = getattr(out, name)
        _expect(isinstance(value, bool), f"Expected {name} as a bool, got {type(value).__name__} {value!r}")
    ended = out.terminated or out.truncated
    for role, up in out.updates.items():
        _expect(isinstance(up, RoleUpdate), f"Expected role {role!r}'s update as a RoleUpdate, got "
                                            f"{type(up).__name__}")
        _expect(up.observation is None or isinstance(up.observation, str),
                f"Expected role {role!r}'s observation as str or None, got {type(up.observation).__name__}")
        _expect(isinstance(up.reward, float) and math.isfinite(up.reward),
                f"Expected role {role!r}'s reward as a finite float, got {up.reward!r}")
        _expect(isinstance(up.reward_terms, dict) and all(
            isinstance(k, str) and isinstance(v, float) and math.isfinite(v) for k, v in up.reward_terms.items()),
            f"Expected role {role!r}'s reward_terms as str -> finite float, got {up.reward_terms!r}"[:300])
        if role not in acted:
            _expect(up.reward == 0.0 and not any(up.reward_terms.values()),
                    f"Expected no reward for role {role!r} before its first action, got {up.reward} "
                    f"({ {k: v for k, v in up.reward_terms.items() if v} })")
        info = up.info
        _expect(isinstance(info, dict), f"Expected role {role!r}'s info as a dict, got {type(info).__name__}")
        _check_features(info.get("features"), f"role {role!r}'s step", keys)
        _expect(isinstance(info.get("privileged"), str),
                f"Expected role {role!r}'s info['privileged'] as str, got {info.get('privileged')!r}"[:300])
        if ended:
            _expect(isinstance(info.get("success"), bool),
                    f"Expected role {role!r}'s info['success'] as a bool at the end, got {info.get('success')!r}")
    info = out.updates[actor].info
    missing = [k for k in ACTOR_INFO_KEYS if k not in info]
    _expect(not missing, f"Expected the acting role {actor!r}'s info to have {list(ACTOR_INFO_KEYS)}, got no {missing}")


def _play(env: MultiAgentEnv, *, seed: int, steps: int) -> list[Any]:
    """Random valid play for ``steps`` steps (games restart at their end), checked; the whole record."""
    rng, _ = seeding.np_random(seed)  # a numpy Generator, as sample_valid_action takes
    out = env.reset(seed=seed)
    keys = _check_reset(env, out, None)
    record: list[Any] = [out]
    acted: set[str] = set()
    for _ in range(steps):
        actor = env.agent_selection
        action = env.sample_valid_action(rng)
        _expect(isinstance(action, str), f"Expected sample_valid_action() to return a str, got {action!r}")
        result = env.step(action)
        acted.add(actor)
        _check_step(result, env.roles, actor, acted, keys)
        valid = result.updates[actor].info["action_valid"]
        _expect(valid is True, f"Expected sample_valid_action() to give an action the env accepts as valid, got "
                               f"action_valid={valid!r} for {action!r}")
        record.append((actor, action, result))
        if result.terminated or result.truncated:
            try:
                late = env.step(action)
            except Exception:  # noqa: BLE001  (any clear error will do)
                pass
            else:
                raise AssertionError(f"Expected step() after the end of a game to raise, got {late!r}"[:300])
            out = env.reset()
            _check_reset(env, out, keys)
            record.append(out)
            acted = set()
        else:
            _check_selection(env)
    return record


def _check_invalid_action(env: MultiAgentEnv, seed: int) -> None:
    env.reset(seed=seed)
    actor = env.agent_selection
    result = env.step("")
    _expect(isinstance(result, MultiStep), f"Expected step() to return a MultiStep, got {type(result).__name__}")
    up = result.updates.get(actor)
    _expect(isinstance(up, RoleUpdate) and isinstance(up.observation, str) and bool(up.observation),
            f"Expected an invalid action to be answered to the acting role {actor!r}, got {up!r}"[:300])
    valid = up.info.get("action_valid")  # type: ignore[union-attr]
    _expect(valid is False, f"Expected action_valid=False for an empty action, got {valid!r}")
    if not (result.terminated or result.truncated):
        _expect(env.agent_selection == actor, f"Expected role {actor!r} to act again after its invalid action, "
                                              f"got agent_selection={env.agent_selection!r}")


def check_multi_agent_env(env: gymnasium.Env, *, seed: int = 0, steps: int = 50) -> None:
    """Check that ``env`` (or the env it wraps) keeps the :class:`MultiAgentEnv` contract.

    Checks the roles (non-empty unique strings), ``tool_docs`` per role, ``reset`` (every role,
    a str observation and the info keys), ``agent_selection``, and every step of ``steps`` steps
    of random valid play (``sample_valid_action`` with a numpy Generator seeded by ``seed``): an
    update for every role, str-or-None observations, finite float rewards, bool endings, the same
    feature keys every time, no reward before a role's first action, ``success`` at the end, and a
    ``step`` after the end that raises. The same play again must give the same outputs, and an
    empty action must be answered to the acting role, who acts again.

    Raises ``AssertionError`` saying "Expected X, got Y" on the first breach.
    """
    base = env.unwrapped
    _expect(isinstance(base, MultiAgentEnv), f"Expected a MultiAgentEnv, got {type(base).__name__}")
    roles = base.roles
    _expect(isinstance(roles, tuple) and len(roles) > 0, f"Expected roles as a non-empty tuple, got {roles!r}")
    _expect(all(isinstance(r, str) and r for r in roles), f"Expected every role as a non-empty str, got {roles!r}")
    _expect(len(set(roles)) == len(roles), f"Expected unique roles, got {roles!r}")
    for role in roles:
        docs = base.tool_docs(role)
        _expect(isinstance(docs, str) and bool(docs.strip()),
                f"Expected tool_docs({role!r}) as a non-empty str, got {docs!r}"[:300])
    first = _play(base, seed=seed, steps=steps)
    again = _play(base, seed=seed, steps=steps)
    for k, (a, b) in enumerate(zip(first, again)):
        _expect(a == b, f"Expected the same outputs for the same seed and actions, got a difference at record {k}: "
                        f"{a!r} vs {b!r}"[:600])
    _check_invalid_action(base, seed)
