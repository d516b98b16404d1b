"""The offline phase's data: episode records read, checked and summarised, then made into token-level episodes.

Any episode JSONL polyturn writes is read with its one reader (:func:`polyturn.acting.jsonl.read_episode_records`):
demonstrations, evaluation episodes, rollouts, ``serve --record`` sessions. A record of another env is refused;
crashed records and records without turns are skipped (and counted). A record whose turns carry the ``action_ids``
its actor sampled keeps them (token-in / token-out) when they are this actor's tokens (they decode to the action
text); every other record is tokenized as BC tokenizes demonstrations (:func:`polyturn.rollout.context.tokenize_demo`).

A record whose outcome nobody knows (a served session closed mid-episode, :func:`polyturn.acting.judge.outcome_known`)
and that ``polyturn judge`` scored ends with the reward term ``judge/score`` (:func:`with_judge_term`, config
``offline.judge``): the judge's score stands in for the outcome it lacks. Records with a known outcome keep their
env's rewards; on them the summary measures the judge's agreement with the outcome (docs/judge.md).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyturn.acting.jsonl import read_episode_records
from polyturn.acting.judge import agreement, outcome_known
from polyturn.models.actor import Actor
from polyturn.rollout.context import Conversation, DemoTokens, RolloutSettings, tokenize_demo
from polyturn.rollout.types import Episode, Segment, Turn

#: Return quantiles the summary shows.
QUANTILES = (10, 25, 50, 75, 90)
#: The reward term an LLM judge's score pays (offline and online).
JUDGE_TERM = "judge/score"


@dataclass
class OfflineData:
    """Records of ``env_id`` read from ``files`` (each record's file in ``sources``), and the ones skipped by why."""

    env_id: str
    files: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    judge_range: tuple[float, float] | None = None
    judge_term: list[bool] = field(default_factory=list)  # per record: it ends with the judge's term


def with_judge_term(rec: dict[str, Any], *, low: float, high: float) -> dict[str, Any]:
    """A copy of ``rec`` whose last turn also pays ``judge/score = low + (high - low) x judge`` (``judge`` in [0, 1],
    ``polyturn judge``'s score): ``low`` for a score of 1, ``high`` for 10. The record's ``return`` includes it.

    >>> last = {"reward": -0.01, "reward_terms": {"penalty/turn_cost": -0.01}}
    >>> rec = {"judge": 0.5, "turns": [{"reward": -0.01}, last]}
    >>> out = with_judge_term(rec, low=-5.0, high=10.0)
    >>> out["turns"][-1]["reward_terms"], round(out["return"], 2), rec["turns"][-1]["reward"]
    ({'penalty/turn_cost': -0.01, 'judge/score': 2.5}, 2.48, -0.01)
    """
    term = low + (high - low) * float(rec["judge"])
    turns = [dict(t) for t in rec["turns"]]
    turns[-1]["reward"] = float(turns[-1].get("reward", 0.0)) + term
    turns[-1]["reward_terms"] = {**(turns[-1].get("reward_terms") or {}), JUDGE_TERM: term}
    return {**rec, "turns": turns, "return": record_return(rec) + term}


def read_offline_data(paths: Sequence[str], *, env_id: str,
                      judge_range: tuple[float, float] | None = None) -> OfflineData:
    """Read every file of ``offline.data``; ``FileNotFoundError`` / ``ValueError`` naming the field and the fix.

    ``judge_range`` ``(low, high)``: a judged record with no known outcome ends with :func:`with_judge_term`; None
    leaves every record's rewards as recorded.
    """
    data = OfflineData(env_id=env_id, files=list(paths), judge_range=judge_range)
    for path in paths:
        records = read_episode_records(path, where=f"offline.data: {path}", missing="an episode JSONL file "
                                       "(offline.data; `polyturn demos --out FILE`, `polyturn evaluate` or `polyturn "
                                       "serve --record DIR` write them)")
        for k, rec in enumerate(records):
            where = f"offline.data: record {k + 1} of {path}"
            got = rec.get("env_id")
            if got != env_id:
                hint = " (a chat session: no environment, no reward)" if got == "chat" else ""
                raise ValueError(f"{where} is an episode of {got!r}{hint}, expected env.id = {env_id!r}; give "
                                 f"episodes of {env_id} only, or set env.id to the records' env")
            if rec.get("role"):
                raise ValueError(f"{where} is one role's view of a multi-role game ({rec['role']!r}); offline RL "
                                 "reads single-agent episodes")
            if rec.get("crashed"):
                data.skipped["crashed"] += 1
            elif not rec["turns"]:
                data.skipped["no turns"] += 1
            else:
                judged = judge_range is not None and rec.get("judge") is not None and not outcome_known(rec)
                if judged:
                    rec = with_judge_term(rec, low=judge_range[0], high=judge_range[1])
                data.records.append(rec)
                data.sources.append(str(path))
                data.judge_term.append(judged)
    if not data.records:
        raise ValueError(f"offline.data: Expected at least one episode with turns in {list(paths)}, got none "
                         f"(skipped: {dict(data.skipped) or 'none'})")
    return data


def record_return(rec: dict[str, Any]) -> float:
    """The record's return (its ``return``, else the sum of its turns' rewards)."""
    r = rec.get("return")
    return float(r) if r is not None else float(sum(t.get("reward", 0.0) for t in rec["turns"]))


def data_summary(data: OfflineData) -> dict[str, Any]:
    """The dataset's return distribution, success rate and turns, and counts per (policy, policy version)."""
    recs = data.records
    rets = np.array([record_return(r) for r in recs], dtype=np.float64)
    out: dict[str, Any] = {
        "episodes": len(recs), "files": len(data.files), "skipped": dict(data.skipped),
        "return_mean": float(rets.mean()), "return_std": float(rets.std()),
        "return_min": float(rets.min()), "return_max": float(rets.max()),
        **{f"return_q{q}": float(np.percentile(rets, q)) for q in QUANTILES},
        "success_rate": sum(bool(r.get("success")) for r in recs) / len(recs),
        "turns_mean": sum(len(r["turns"]) for r in recs) / len(recs),
    }
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(recs):
        key = (str(r.get("policy") or "unknown"), str(r.get("policy_version") or "unknown"))
        groups.setdefault(key, []).append(i)
    out.update(judge_summary(data))
    out["by_policy"] = [{"policy": p, "policy_version": v, "episodes": len(ix),
                         "return_mean": float(rets[ix].mean()),
                         "success_rate": sum(bool(recs[i].get("success")) for i in ix) / len(ix)}
                        for (p, v), ix in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    return out


def judge_summary(data: OfflineData) -> dict[str, Any]:
    """The judge's part of the summary: how many records it scored, how many take its term, how many have neither
    an outcome nor a score, and its agreement with the known outcomes (:func:`polyturn.acting.judge.agreement`)."""
    recs = data.records
    known = [r for r in recs if outcome_known(r)]
    scored = [r for r in known if r.get("judge") is not None]
    a = agreement([float(r["judge"]) for r in scored], [bool(r.get("success")) for r in scored])
    return {"judged": sum(r.get("judge") is not None for r in recs), "judge_term": sum(data.judge_term),
            "no_outcome_unjudged": sum(not outcome_known(r) and r.get("judge") is None for r in recs),
            "judge_agreement": a}


def summary_lines(s: dict[str, Any], env_id: str) -> list[str]:
    """The summary as the reporter shows it, return distribution first."""
    skipped = ", ".join(f"{n} {why}" for why, n in s["skipped"].items())
    qs = ", ".join(f"q{q} {s[f'return_q{q}']:.2f}" for q in QUANTILES)
    lines = [f"offline data: {s['episodes']} episodes of {env_id} from {s['files']} file(s)"
             + (f" (skipped: {skipped})" if skipped else ""),
             f"  return: mean {s['return_mean']:.2f}, std {s['return_std']:.2f}; min {s['return_min']:.2f}, {qs}, "
             f"max {s['return_max']:.2f}",
             f"  success rate {s['success_rate']:.3f}, {s['turns_mean']:.1f} turns per episode",
             "  by policy / policy version:"]
    lines += [f"    {g['policy']} / {g['policy_version']}: {g['episodes']} episodes, return mean "
              f"{g['return_mean']:.2f}, success rate {g['success_rate']:.3f}" for g in s["by_policy"]]
    return lines + judge_lines(s)


def judge_lines(s: dict[str, Any]) -> list[str]:
    """The judge's lines of the summary (none when no record was judged and every outcome is known)."""
    lines, a = [], s["judge_agreement"]
    if s["judged"]:
        lines.append(f"  judge: {s['judged']} episodes scored, {s['judge_term']} without a known outcome end with "
                     "the term judge/score")
        lines.append(f"  judge agreement with the known outcomes: not measured ({a['n']} scored with an outcome, "
                     f"{a['successes']} successes: it needs both)" if a["auc"] is None else
                     f"  judge agreement with the known outcomes on {a['n']} episodes: accuracy {a['accuracy']:.3f}, "
                     f"AUC {a['auc']:.3f}" + (f", Spearman {a['spearman']:.3f}" if a["spearman"] is not None else ""))
    if s["no_outcome_unjudged"]:
        lines.append(f"  {s['no_outcome_unjudged']} episodes have no known outcome and no judge score: their return "
                     "is only their turns' rewards (`polyturn judge --data FILE ...` scores them)")
    return lines


def summary_metrics(s: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers under ``offline/data_*``, for the metrics log."""
    keys = ["episodes", "return_mean", "return_std", "return_min", "return_max", "success_rate", "turns_mean",
            *(f"return_q{q}" for q in QUANTILES)]
    out = {f"offline/data_{k}": float(s[k]) for k in keys}
    a = s["judge_agreement"]
    if s["judged"]:
        out.update({"offline/data_judged": float(s["judged"]), "offline/data_judge_term": float(s["judge_term"])})
        out.update({f"judge/{name}": float(a[k]) for name, k in (("agreement", "accuracy"), ("auc", "auc"),
                                                                  ("spearman", "spearman")) if a[k] is not None})
    return out


def _recorded_ids(actor: Actor, turn: dict[str, Any]) -> list[int] | None:
    """The turn's recorded ``action_ids`` when they are this actor's tokens of its action text, else None."""
    ids = turn.get("action_ids")
    if not ids or not all(isinstance(i, int) and 0 <= i < len(actor.tokenizer) for i in ids):
        return None
    body = ids[:-1] if ids[-1] == actor.stop_id else ids
    return list(ids) if actor.tokenizer.decode(body, skip_special_tokens=False) == turn["action"] else None


def record_tokens(actor: Actor, settings: RolloutSettings, rec: dict[str, Any], *,
                  system: str | None) -> tuple[DemoTokens, bool]:
    """A record's token segments, and whether they hold its recorded action ids (else it was tokenized as BC
    tokenizes a demonstration). Recorded ids longer than ``max_action_tokens`` are cut as BC cuts an action."""
    turns = rec["turns"]
    recorded = [_recorded_ids(actor, t) for t in turns]
    if any(ids is None for ids in recorded):
        return tokenize_demo(actor, settings, rec, system=system), False
    conv = Conversation(actor, settings, task=turns[0]["observation"], system=system)
    cap, n_cut, longest = settings.max_action_tokens, 0, 0
    for t, (turn, ids) in enumerate(zip(turns, recorded)):
        if conv.needs_rebuild():
            conv.rebuild()
        lps = [float(x) for x in (turn.get("logprobs") or [0.0] * len(ids))][: len(ids)]
        lps += [0.0] * (len(ids) - len(lps))
        longest = max(longest, len(ids))
        if len(ids) > cap:
            n_cut += 1
            ids, lps = ids[: cap - 1] + [actor.stop_id], lps[: cap - 1] + [0.0]
        conv.add_action(ids, lps, turn=t, text=turn["action"])
        if t + 1 < len(turns):
            conv.add_observation(turns[t + 1]["observation"], close_action=ids[-1] != actor.stop_id)
    return DemoTokens(segments=conv.segments, n_actions=len(turns), n_cut=n_cut, longest_action=longest), True


def record_episode(rec: dict[str, Any], segments: list[Segment]) -> Episode:
    """The :class:`Episode` of a record, on the token ``segments`` made for it.

    A turn's state is what the record says held before it: the privileged text and features of the previous step's
    info (the record's own privileged text before the first turn; the first state's features are not recorded and
    read as none). The last turn's info gets the record's ``success``.
    """
    turns = rec["turns"]
    ids: list[list[int]] = [[] for _ in turns]
    lps: list[list[float]] = [[] for _ in turns]
    for seg in segments:
        for i, t in enumerate(seg.turn_index):
            if t >= 0:
                ids[t].append(seg.ids[i])
                lps[t].append(seg.logprobs[i])
    ep = Episode(env_id=str(rec["env_id"]), seed=rec.get("seed"), task_id=str(rec.get("task_id", "")),
                 question=str(rec.get("question", "")), level=int(rec.get("level") or 0),
                 ambiguous=bool(rec.get("ambiguous", False)), key_actions=list(rec.get("key_actions", [])),
                 segments=segments, final_observation=str(rec.get("final_observation", "")),
                 policy=str(rec.get("policy") or "unknown"))
    privileged, features = str(rec.get("privileged", "")), {}
    for t, turn in enumerate(turns):
        info = dict(turn.get("info") or {})
        ep.turns.append(Turn(observation=turn["observation"], action=turn["action"], action_ids=ids[t],
                             logprobs=lps[t], reward=float(turn["reward"]),
                             reward_terms=dict(turn.get("reward_terms") or {}),
                             cost_terms=dict(turn.get("cost_terms") or {}), terminated=bool(turn.get("terminated")),
                             truncated=bool(turn.get("truncated")), info=info, privileged=privileged,
                             features=features, forced=bool(turn.get("forced", False))))
        privileged = str(info.get("privileged", privileged))
        features = {k: float(v) for k, v in (info.get("features") or {}).items()}
    ep.final_privileged, ep.final_features = privileged, features
    ep.turns[-1].info["success"] = bool(rec.get("success", False))
    return ep


def held_out_split(records: Sequence[dict[str, Any]], share: float, *, seed: int) -> tuple[list[int], list[int]]:
    """``(train, held_out)`` record indices: ``share`` of the tasks (a record's seed, else its task id), drawn with
    ``seed``, held out whole (every record of a task on one side); at least one task each side when ``share > 0``
    and there are two tasks or more."""
    tasks = sorted({str(r.get("seed", r.get("task_id"))) for r in records})
    n = min(len(tasks) - 1, max(1, round(share * len(tasks)))) if share > 0 and len(tasks) > 1 else 0
    held = set(random.Random(seed).sample(tasks, n))
    train = [i for i, r in enumerate(records) if str(r.get("seed", r.get("task_id"))) not in held]
    return train, [i for i, r in enumerate(records) if str(r.get("seed", r.get("task_id"))) in held]

