"""Off-policy evaluation of a checkpoint on recorded sessions (``polyturn evaluate --offline``, the serve ramp's gate).

Served records (``polyturn serve --record DIR``) hold, per turn, the tokens appended to the context before the
action (``context_ids``, ``context_restart``), the sampled ``action_ids`` with their behaviour ``logprobs`` and the
sampling ``temperature``. The context each action was sampled from is rebuilt token for token from them
(:func:`record_segments`), and the new policy re-scores the recorded actions on it, at the recorded temperature
(log-probs of the full temperature-scaled distribution, as the server records them; top-p is not applied). A
turn's importance ratio is the product of its tokens' ratios. The estimators are :mod:`polyturn.algos.ope`'s.

What it estimates: the value of serving the new checkpoint, at the recorded temperatures, to the recorded
sessions' users and tasks. Records of evaluation runs, rollouts or demonstrations hold no behaviour log-probs
and are refused, as are greedy (temperature 0) sessions: a deterministic behaviour gives no ratio.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polyturn.acting.jsonl import RECORD_FILE, read_episode_records
from polyturn.algos.ope import (
    bootstrap_interval,
    effective_sample_size,
    log_weights,
    per_decision_wis,
    weighted_doubly_robust,
)
from polyturn.models.actor import Actor
from polyturn.models.critic import SeparateCritic
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.types import Segment



class OPEError(ValueError):
    """Records or a checkpoint off-policy evaluation cannot use; the message says why and what to do."""


def read_records(paths: Sequence[str | Path], *, partial_tail: bool = False) -> list[dict[str, Any]]:
    """Episode records from files or ``serve --record`` directories (their ``sessions.jsonl``); records without
    turns are dropped. ``partial_tail``: a file a server is still appending to (its last line may be partial)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        path = Path(p) / RECORD_FILE if Path(p).is_dir() else Path(p)
        out += [rec for rec in read_episode_records(path, partial_tail=partial_tail, missing="recorded sessions "
                                                    f"(`polyturn serve --record DIR` writes DIR/{RECORD_FILE})")
                if rec["turns"]]
    return out


def _problem(turn: dict[str, Any]) -> str | None:
    """Why a recorded turn cannot be re-scored (``logprobs``, ``context``, ``greedy``), or None."""
    if not turn.get("logprobs") or len(turn["logprobs"]) != len(turn.get("action_ids") or []):
        return "logprobs"
    if "context_ids" not in turn:
        return "context"
    if float(turn.get("temperature", 0.0)) <= 0:
        return "greedy"
    return None


def usable(rec: dict[str, Any]) -> bool:
    """Whether :func:`check_records` would accept the record (log-probs, context tokens, sampled turns)."""
    return bool(rec["turns"]) and all(_problem(t) is None for t in rec["turns"])


def check_records(records: Sequence[dict[str, Any]], *, source: str) -> None:
    """:class:`OPEError` unless every record can be re-scored: turns with behaviour log-probs, the recorded
    context and a sampling temperature above 0."""
    if not records:
        raise OPEError(f"{source}: Expected recorded sessions with turns, got none")
    bad: dict[str, list[int]] = {}
    for k, r in enumerate(records):
        for why in {_problem(t) for t in r["turns"]} - {None}:
            bad.setdefault(why, []).append(k)

    def count(why: str) -> str:
        return f"{len(bad[why])} of {len(records)} episodes (first: record {bad[why][0] + 1})"

    if "logprobs" in bad:
        raise OPEError(
            f"{source}: Expected behaviour log-probs on every turn (turns with action_ids and logprobs of the same "
            f"length, as `polyturn serve --record DIR` writes), got {count('logprobs')} without. Evaluation "
            "episodes, rollouts and demonstrations carry none: off-policy evaluation needs the probabilities the "
            "recorded actions were sampled with")
    if "context" in bad:
        raise OPEError(
            f"{source}: Expected each turn's context tokens (context_ids), got {count('context')} without: "
            "recorded by a server older than off-policy evaluation; record the sessions again with this version's "
            "`polyturn serve --record DIR`")
    if "greedy" in bad:
        raise OPEError(
            f"{source}: Expected sampled sessions (temperature > 0), got {count('greedy')} with greedy turns: a "
            "greedy behaviour has no probabilities to weigh by; serve the sessions to evaluate on with "
            "temperature > 0")


def record_segments(rec: dict[str, Any]) -> list[Segment]:
    """The token contexts a served record's actions were sampled from: one segment per context restart, each
    turn's ``context_ids`` then its ``action_ids`` (marked with the turn's index)."""
    segments: list[Segment] = []
    for t, turn in enumerate(rec["turns"]):
        if turn.get("context_restart") or not segments:
            segments.append(Segment())
        segments[-1].add_context([int(i) for i in turn["context_ids"]])
        segments[-1].add_action([int(i) for i in turn["action_ids"]], [float(x) for x in turn["logprobs"]], t)
    return segments


def _check_tokens(actor: Actor, records: Sequence[dict[str, Any]], *, source: str) -> None:
    """:class:`OPEError` when the recorded ids are not this actor's tokens (another tokenizer sampled them)."""
    vocab = len(actor.tokenizer)
    for k, rec in enumerate(records):
        for turn in rec["turns"]:
            ids = [int(i) for i in turn["action_ids"]] + [int(i) for i in turn["context_ids"]]
            body = turn["action_ids"][:-1] if turn["action_ids"][-1] == actor.stop_id else turn["action_ids"]
            if any(not 0 <= i < vocab for i in ids) or \
                    actor.tokenizer.decode(body, skip_special_tokens=False) != turn["action"]:
                raise OPEError(f"{source}: record {k + 1}: Expected action tokens of this checkpoint's tokenizer "
                               "(they decode to the recorded action), got ids that do not: the sessions were served "
                               "by a model with another tokenizer, which this checkpoint cannot be weighed against")


@torch.no_grad()
def turn_logprobs(actor: Actor, records: Sequence[dict[str, Any]], *, batch_segments: int = 8) -> list[np.ndarray]:
    """Per record, each turn's summed log-prob of its recorded action tokens under ``actor``, at the turn's recorded
    temperature, computed on the recorded context (one forward pass per segment, as training re-scores)."""
    items: list[tuple[int, Segment, list[float]]] = []
    for r, rec in enumerate(records):
        temps = [float(t["temperature"]) for t in rec["turns"]]
        items += [(r, seg, temps) for seg in record_segments(rec)]
    out = [np.zeros(len(rec["turns"])) for rec in records]
    items.sort(key=lambda x: len(x[1]))
    for start in range(0, len(items), batch_segments):
        chunk = items[start: start + batch_segments]
        n = max(len(seg) for _, seg, _ in chunk)
        ids = torch.full((len(chunk), n), actor.pad_id, dtype=torch.long)
        attn = torch.zeros(len(chunk), n, dtype=torch.long)
        for row, (_, seg, _) in enumerate(chunk):
            ids[row, : len(seg)] = torch.tensor(seg.ids)
            attn[row, : len(seg)] = 1
        hidden = actor.hidden_states(ids.to(actor.device), attn.to(actor.device))
        for row, (r, seg, temps) in enumerate(chunk):
            pos = [i for i in range(1, len(seg)) if seg.action_mask[i]]
            turns = [seg.turn_index[i] for i in pos]
            temp = torch.tensor([temps[t] for t in turns], device=actor.device)[:, None]
            logits = actor.head(hidden[row, [p - 1 for p in pos]]).float() / temp
            lp = torch.log_softmax(logits, -1).gather(-1, ids[row, pos].to(actor.device)[:, None]).squeeze(-1)
            np.add.at(out[r], turns, lp.double().cpu().numpy())
    return out


def load_value_critic(checkpoint_dir: Path) -> tuple[SeparateCritic | None, str]:
    """The checkpoint's state-value critic for doubly robust estimates, or None and why there is none."""
    cfg_file = checkpoint_dir / "critic" / "critic_config.json"
    if cfg_file.is_file():
        kind = json.loads(cfg_file.read_text()).get("kind")
        if kind == "separate":
            return SeparateCritic.from_pretrained(checkpoint_dir / "critic").eval(), ""
        return None, (f"the checkpoint's critic is of kind {kind!r}; doubly robust reads a separate state-value "
                      "critic (critic.kind: separate)")
    if (checkpoint_dir / "value_head.safetensors").is_file():
        return None, ("the checkpoint's critic is the shared value head (critic.kind: shared); doubly robust reads "
                      "a separate state-value critic (critic.kind: separate)")
    return None, f"{checkpoint_dir} holds no critic (critic/): trained without one"


def critic_inputs(rec: dict[str, Any]) -> list[CriticInput]:
    """The critic's view of the state before each turn of a record (what ``state_input`` reads in training: the
    privileged text and features of the previous step's info)."""
    turns = rec["turns"]
    out, privileged, features = [], str(rec.get("privileged", "")), {}
    for t, turn in enumerate(turns):
        history = [(turns[k]["action"], turns[k + 1]["observation"]) for k in range(t)]
        out.append(CriticInput(task=str(rec.get("question") or turns[0]["observation"]), history=history,
                               privileged=privileged, features=features))
        info = turn.get("info") or {}
        privileged = str(info.get("privileged", privileged))
        features = {k: float(v) for k, v in (info.get("features") or {}).items()}
    return out


@dataclass
class Estimate:
    """A point estimate and its bootstrap interval."""

    value: float
    lo: float
    hi: float


@dataclass
class OPEReport:
    """What ``polyturn evaluate --offline`` prints and writes (see docs/offline.md, "Off-policy evaluation")."""

    policy: str
    episodes: int
    turns: int
    behaviour: dict[str, int]  # episodes per recorded policy version
    recorded: dict[str, float]  # the records' own success rate and mean return (the behaviour's value)
    wis: dict[str, Estimate]  # per-decision weighted importance sampling: success, return
    dr: dict[str, Estimate] | None  # weighted doubly robust with the critic: return
    dr_unavailable: str
    ess: float  # effective sample size of the episodes' final weights
    clip: float
    clipped: float  # share of episodes whose weight reached the clip
    mean_abs_log_ratio: float  # per turn: how far the policies are apart on the recorded actions
    forced_turns: int  # turns exploration forced (their recorded log-probs are the policy's, not the behaviour's)
    confidence: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def _padded(rows: Sequence[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def estimate(
    actor: Actor,
    records: Sequence[dict[str, Any]],
    *,
    policy: str,
    critic: SeparateCritic | None = None,
    dr_unavailable: str = "",
    clip: float = 10.0,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    source: str = "records",
) -> OPEReport:
    """Estimate ``actor``'s success rate and return on ``records`` (see the module docstring)."""
    check_records(records, source=source)
    _check_tokens(actor, records, source=source)
    new = turn_logprobs(actor, records)
    old = [np.array([sum(float(x) for x in t["logprobs"]) for t in r["turns"]]) for r in records]
    n, width = len(records), max(len(r["turns"]) for r in records)
    mask = _padded([np.ones(len(r["turns"])) for r in records], width).astype(bool)
    log_ratios = _padded([a - b for a, b in zip(new, old)], width)
    rewards = _padded([np.array([float(t.get("reward", 0.0)) for t in r["turns"]]) for r in records], width)
    success = _padded([np.eye(len(r["turns"]))[-1] * float(bool(r.get("success"))) for r in records], width)
    lw = log_weights(log_ratios, mask, clip=clip)
    values = None
    if critic is not None:
        with torch.no_grad():
            values = _padded([critic.values(critic_inputs(r)).double().cpu().numpy() for r in records], width)

    def interval(stat) -> Estimate:
        lo, hi = bootstrap_interval(stat, n, confidence=confidence, n_resamples=n_resamples, seed=seed)
        return Estimate(value=stat(np.arange(n)), lo=lo, hi=hi)

    wis = {"success": interval(lambda ix: per_decision_wis(lw[ix], success[ix])),
           "return": interval(lambda ix: per_decision_wis(lw[ix], rewards[ix]))}
    dr = None
    if values is not None:
        dr = {"return": interval(lambda ix: weighted_doubly_robust(lw[ix], rewards[ix], values[ix]))}
    final = lw[:, -1]
    forced = sum(bool(t.get("forced")) for r in records for t in r["turns"])
    notes = []
    if forced:
        notes.append(f"{forced} turns were forced by exploration: their recorded log-probs are the policy's, not the "
                     "exploring behaviour's, so their weights are approximate")
    return OPEReport(
        policy=policy, episodes=n, turns=int(mask.sum()),
        behaviour=dict(Counter(str(r.get("policy_version") or r.get("policy") or "unknown") for r in records)),
        recorded={"success": float(np.mean([bool(r.get("success")) for r in records])),
                  "return": float(rewards.sum(1).mean())},
        wis=wis, dr=dr, dr_unavailable="" if dr is not None else (dr_unavailable or "no critic given"),
        ess=effective_sample_size(final), clip=clip, clipped=float(np.mean(final >= np.log(clip) - 1e-9)),
        mean_abs_log_ratio=float(np.abs(log_ratios[mask]).mean()), forced_turns=forced, confidence=confidence,
        notes=notes,
    )
