"""Running a text policy for an episode, demonstrations, and readable transcripts.

One record per episode, in the format of docs/ARCHITECTURE.md ("Episode
records"); ``turns[t].observation`` is what the policy saw before writing
``turns[t].action``, and ``final_observation`` is the last observation.

A policy is any object with ``reset(obs, info)``, ``act(obs, info) -> str``
and a ``name`` (:class:`polyturn.acting.registry.TextPolicy`, e.g. an env's
scripted expert). Records are read and written with :mod:`polyturn.acting.jsonl`.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium

from polyturn.acting.registry import TextPolicy, env_id_of, make_env, make_expert
from polyturn.envs.actions import ToolCall, format_action, parse_action
from polyturn.envs.multi_agent import is_multi_agent
from polyturn.rollout.types import EVAL_TURN_INFO_KEYS, TURN_INFO_KEYS, cost_field


def episode_head(*, env_id: str, seed: int | None, policy: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """An episode record as reset leaves it: the task's fields, no turns, no success yet."""
    return {
        "env_id": env_id,
        "seed": seed,
        "task_id": str(info.get("task_id", "")),
        "policy": policy,
        "success": False,
        "return": 0.0,
        "level": int(info.get("level", 0) or 0),
        "ambiguous": bool(info.get("ambiguous", False)),
        "question": str(info.get("question", "")),
        "privileged": str(info.get("privileged", "")),
        "key_actions": list(info.get("key_actions", [])),
        "turns": [],
        "final_observation": "",
    }


def exception_text(error: BaseException) -> str:
    """``"ValueError: message"`` (no traceback), as an evaluation record's ``crash`` keeps it."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()


def run_episode(
    env: gymnasium.Env,
    policy: TextPolicy,
    *,
    seed: int | None,
    options: Mapping[str, Any] | None = None,
    label: str | None = None,
    for_eval: bool = False,
) -> dict[str, Any]:
    """Play one episode with ``policy`` from ``env.reset(seed=seed, options=options)`` and return its record.

    Args:
        env: the environment (a gymnasium env; its spec names the record's ``env_id``).
        policy: a :class:`TextPolicy`.
        seed: the task seed.
        options: reset options (task id, level, turn limit ...).
        label: the record's ``policy`` (default ``policy.name``).
        for_eval: write an evaluation record (:mod:`polyturn.eval.records`): per turn ``latency_s``
            (``act`` plus ``step``) and ``forced`` (always False), turn info as actor rollouts keep
            it, and an exception ends the episode as ``crashed`` (its text in ``crash``) instead of
            propagating. Demonstrations leave it False.
    """
    env_id = env_id_of(env)
    name = label if label is not None else policy.name
    info: dict[str, Any] = {}
    try:
        obs, info = env.reset(seed=seed, options=dict(options) if options else None)
    except Exception as e:  # noqa: BLE001  (in evaluation a crash is a result to report)
        if not for_eval:
            raise
        return episode_head(env_id=env_id, seed=seed, policy=name, info={}) | {"crashed": True,
                                                                               "crash": exception_text(e)}
    record = episode_head(env_id=env_id, seed=seed, policy=name, info=info)
    if for_eval:
        record |= {"crashed": False, "crash": None}
    keys = EVAL_TURN_INFO_KEYS if for_eval else TURN_INFO_KEYS
    total = 0.0
    try:
        policy.reset(obs, info)
        while True:
            t0 = time.perf_counter()
            action = policy.act(obs, info)
            next_obs, reward, terminated, truncated, info = env.step(action)
            latency = time.perf_counter() - t0
            total += float(reward)
            turn: dict[str, Any] = {"observation": obs, "action": action, "reward": float(reward),
                                    "reward_terms": dict(info["reward_terms"]),
                                    **cost_field(info), "terminated": bool(terminated), "truncated": bool(truncated)}
            if for_eval:
                turn |= {"latency_s": latency, "forced": False}
            turn["info"] = {k: (dict(info[k]) if k == "features" else info[k]) for k in keys if k in info}
            record["turns"].append(turn)
            obs = next_obs
            if terminated or truncated:
                record["success"] = bool(info.get("success", False))
                record["final_observation"] = obs
                break
    except Exception as e:  # noqa: BLE001
        if not for_eval:
            raise
        record.update(crashed=True, crash=exception_text(e))
    record["return"] = total
    return record


#: How many seeds past ``episodes`` a balanced generation may try before it gives up on a group's quota.
SEARCH_FACTOR = 20


def group_quotas(episodes: int, shares: Mapping[str, float]) -> dict[str, int]:
    """Episodes each named group gets: ``round(share x episodes)``; the rest go to the groups not named."""
    bad = {g: s for g, s in shares.items() if not 0 < s <= 1}
    if bad:
        raise ValueError(f"Expected each group share in (0, 1], got {bad}")
    if sum(shares.values()) > 1 + 1e-9:
        raise ValueError(f"Expected group shares that sum to at most 1, got {sum(shares.values()):g} ({dict(shares)})")
    return {g: round(s * episodes) for g, s in shares.items()}


def breakdown_of(env_id: str, name: str | None) -> Callable[[Mapping[str, Any]], str]:
    """The env spec's breakdown ``name`` (a record -> its group), or ``ValueError`` naming the env's breakdowns."""
    from polyturn.acting.registry import env_spec

    known = env_spec(env_id).breakdowns
    if name not in known:
        raise ValueError(f"Expected balance_by to name one of {env_id}'s breakdowns {sorted(known)}, got {name!r}")
    return known[name]


class GroupQuota:
    """Fills ``total`` places by group: each group named in ``shares`` gets ``round(share x total)`` of them
    (:func:`group_quotas`), the groups not named the rest. :meth:`take` says whether an item of a group still
    fits (and counts it); a caller walks items in order and drops the ones refused."""

    def __init__(self, total: int, shares: Mapping[str, float], *, label: str = "group") -> None:
        self.total, self.label = total, label
        self.quotas = group_quotas(total, shares)
        self.left = dict(self.quotas)
        self.rest = total - sum(self.quotas.values())
        self.seen: Counter = Counter()

    @property
    def full(self) -> bool:
        return self.rest + sum(self.left.values()) == 0

    def take(self, group: str) -> bool:
        self.seen[group] += 1
        if self.left.get(group, 0) > 0:
            self.left[group] -= 1
        elif group not in self.left and self.rest > 0:
            self.rest -= 1
        else:
            return False
        return True

    def shortfall(self, where: str) -> str:
        """Why the places are not filled, for an error message (``where``: the items tried)."""
        others = self.total - sum(self.quotas.values())
        found = {g: f"{self.quotas[g] - n} of {self.quotas[g]}" for g, n in self.left.items() if n}
        found |= {"other groups": f"{others - self.rest} of {others}"} if self.rest else {}
        return (f"Expected {self.label} quotas {self.quotas} within {where}, found only {found}; the groups seen: "
                f"{dict(self.seen)}")


def generate_demos(
    env_id: str,
    *,
    episodes: int,
    noise: Any,
    seed: int,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    expert_options: Mapping[str, Any] | None = None,
    balance_by: str | None = None,
    group_shares: Mapping[str, float] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield ``episodes`` records of the env's scripted expert; episode ``i`` uses seed ``seed + i``.
    ``expert_options``: keyword options of the expert class (:func:`~polyturn.acting.registry.make_expert`).

    With ``group_shares`` ({group: share}), the episodes are grouped by the env spec's breakdown ``balance_by``
    (CustomerService's ``intent``) and each named group gets ``round(share x episodes)`` of them, the groups not
    named the rest (:class:`GroupQuota`): the expert plays seeds ``seed, seed + 1, ...`` as before and an episode
    whose group is full is dropped, so the records are the plain generation's, in seed order, less the dropped
    ones. A quota not filled within ``SEARCH_FACTOR x episodes`` seeds raises ``ValueError`` naming the groups seen.

    ``progress(1)`` is called after each episode kept (the CLI turns it into a progress bar).
    """
    if episodes < 0:
        raise ValueError(f"Expected episodes >= 0, got {episodes}")
    quota = group_of = None
    if group_shares:
        group_of = breakdown_of(env_id, balance_by)
        quota = GroupQuota(episodes, group_shares, label=str(balance_by))
    env = make_env(env_id, env_kwargs)
    if is_multi_agent(env):
        env.close()
        raise ValueError(f"Expected a single-agent environment for demonstrations (its scripted expert plays one "
                         f"side against a scripted partner), got the multi-role form of {env_id} (env kwargs "
                         f"{dict(env_kwargs or {})}): make them from its single-agent form, e.g. `polyturn demos --env "
                         f"{env_id} --out demos.jsonl` without the self-play kwargs, and set bc.demos to that file")
    try:
        policy = make_expert(env, noise=noise, seed=seed, options=expert_options)
        kept = 0
        for i in range(SEARCH_FACTOR * max(episodes, 1) if quota else episodes):
            if kept == episodes:
                return
            record = run_episode(env, policy, seed=seed + i)
            if quota is not None and not quota.take(group_of(record)):
                continue
            kept += 1
            yield record
            if progress is not None:
                progress(1)
        if quota is not None and not quota.full:
            raise ValueError(quota.shortfall(f"seeds {seed}..{seed + i}"))
    finally:
        env.close()


def task_group(env: gymnasium.Env, group_of: Callable[[Mapping[str, Any]], str], *, seed: int,
               options: Mapping[str, Any] | None = None) -> str:
    """The group of the task ``env.reset(seed, options)`` sets, read from the episode record as reset leaves it
    (a breakdown that reads the task, such as CustomerService's intent from the privileged text)."""
    _, info = env.reset(seed=seed, options=dict(options) if options else None)
    return group_of(episode_head(env_id=env_id_of(env), seed=seed, policy="", info=info))


def _indent(label: str, text: str) -> str:
    lines = text.splitlines() or [""]
    pad = " " * (len(label) + 2)
    return f"{label}: {lines[0]}" + "".join(f"\n{pad}{line}" for line in lines[1:])


def format_transcript(record: Mapping[str, Any]) -> str:
    """A readable transcript: USER / THOUGHT / ACTION / OBSERVATION lines and each turn's reward."""
    flags = f"level {record.get('level')}" + (", ambiguous" if record.get("ambiguous") else "")
    out = [f"=== {record.get('task_id')} ({flags}) policy={record.get('policy')} seed={record.get('seed')}"]
    turns = record.get("turns", [])
    if turns:
        out.append(_indent("USER", turns[0]["observation"]))
    for t, turn in enumerate(turns):
        parsed = parse_action(turn["action"])
        if isinstance(parsed, ToolCall):
            if parsed.thought:
                out.append(_indent("THOUGHT", parsed.thought))
            out.append(_indent("ACTION", format_action(parsed.tool, parsed.args).removeprefix("Action: ")))
        else:
            out.append(_indent("ACTION", turn["action"].strip() or "(empty)"))
        after = turns[t + 1]["observation"] if t + 1 < len(turns) else record.get("final_observation", "")
        label = "USER" if turn["info"]["action_type"] == "ask_user" else "OBSERVATION"
        out.append(_indent(label, after))
        paid = ", ".join(f"{k} {v:+.2f}" for k, v in turn["reward_terms"].items() if v)
        out.append(f"  reward {turn['reward']:+.2f} ({paid})")
    verdict = "success" if record.get("success") else "failure"
    out.append(f"=== {verdict}, return {record.get('return', 0.0):+.2f}")
    return "\n".join(out)
