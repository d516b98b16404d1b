"""Training-health checks over ``metrics.jsonl`` records: pure functions, documented thresholds.

Each check returns :class:`TrainingWarning` s carrying the remedy from the
troubleshooting table of seed 000 (section 4.4). Windows are counted in RL
updates (records with an ``iter``); a "change over a window" is the slope of
a least-squares line through the window times its length minus one, which a
single noisy point cannot fake as easily as a first-to-last difference.

=====================  ==========================================================================
check                  fires when (defaults)
=====================  ==========================================================================
reward spike           a first difference of the return or of a reward term has a robust
                       (modified) z-score above ``SPIKE_Z`` = 3.5 (Iglewicz & Hoaglin):
                       ``0.6745 (d - median(d)) / MAD(d)``
collapse               over ``WINDOW`` = 5 updates entropy falls by >= ``ENTROPY_DROP`` = 20%
                       while repeated identical actions rise by >= ``REPEAT_RISE`` = 0.05
                       (``charts/repeat_rate`` if logged, else ``|reward/penalty/repeat|`` per
                       episode); or >= ``DEGENERATE_SHARE`` = 20% of sampled actions are
                       degenerate (one character, or one short piece, repeated)
reward hacking         over ``WINDOW`` updates a ``process/`` or ``subgoal/`` term rises by
                       >= max(``HACK_RISE_ABS`` = 0.02, ``HACK_RISE_REL`` = 25% of its level)
                       while the success rate falls by >= ``HACK_SUCCESS_DROP`` = 0.05
critic divergence      the value loss rises at each of ``DIVERGE_UPDATES`` = 5 consecutive
                       updates and ends >= ``DIVERGE_FACTOR`` = 1.5x where the run began;
                       or the value loss is not finite
=====================  ==========================================================================
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

SPIKE_Z = 3.5
WINDOW = 5
ENTROPY_DROP = 0.20
REPEAT_RISE = 0.05
DEGENERATE_SHARE = 0.20
HACK_RISE_ABS = 0.02
HACK_RISE_REL = 0.25
HACK_SUCCESS_DROP = 0.05
DIVERGE_UPDATES = 5
DIVERGE_FACTOR = 1.5

Kind = Literal["reward_spike", "collapse", "reward_hacking", "critic_divergence"]

REMEDIES: dict[str, str] = {
    "reward_spike": (
        "Visualise the reward curves and find the term that jumped; check its rule for a bug or an exploit, and "
        "simplify the reward function so that it stays strongly tied to the final goal (seed 000, 4.4)."
    ),
    "collapse": (
        "Raise exploration: sampling temperature (curriculum.temperature), epsilon (curriculum.epsilon) and an "
        "entropy bonus (curriculum.ent_coef); make sure training data mixes successful and failed trajectories; "
        "if updates are large, lower actor.lr or ppo.clip and raise ppo.episodes_per_iter; consider a larger actor "
        "(seed 000, 4.4: late-stage plateau / incoherent behaviour)."
    ),
    "reward_hacking": (
        "The reward has a loophole: re-examine this term's rule so that it pays for the useful result an action "
        "brings (outcome-based), not for doing the action; lower or remove its weight "
        "(env.kwargs.reward_weights) and keep sub-goal terms paid once per episode (seed 000, 4.4)."
    ),
    "critic_divergence": (
        "Lower the critic's learning rate (critic.lr, well below actor.lr); check the V_target computation "
        "(gamma, terminal rewards, episode-termination logic) by printing V_target and V(S) for whole episodes "
        "(the table in this report); use the target network with soft updates (critic.target: td, "
        "critic.tau: 0.005) (seed 000, 4.4)."
    ),
}


@dataclass
class TrainingWarning:
    """A detected problem: what, where (RL iterations), the evidence, and what to do."""

    kind: Kind
    metric: str
    message: str
    start_iter: int | None = None
    end_iter: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def remedy(self) -> str:
        """The remedy for this kind of problem (seed 000, 4.4)."""
        return REMEDIES[self.kind]


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):  # RunLogger writes non-finite floats as "nan" / "inf"
        try:
            return float(v)
        except ValueError:
            return None
    return None


def rl_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RL-update records (those with an ``iter`` and a training phase), in iteration order."""
    out = [r for r in records if "iter" in r and not str(r.get("phase", "")).startswith("eval")]
    return sorted(out, key=lambda r: r["iter"])


def series(records: Sequence[dict[str, Any]], key: str, *, finite: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(iters, values)`` of ``key`` over the RL records that have it (non-finite values dropped if ``finite``)."""
    xs, ys = [], []
    for r in rl_records(records):
        v = _num(r.get(key))
        if v is None or (finite and not math.isfinite(v)):
            continue
        xs.append(int(r["iter"]))
        ys.append(v)
    return np.array(xs, int), np.array(ys, float)


def robust_z(values: Sequence[float]) -> np.ndarray:
    """Modified z-scores ``0.6745 (x - median) / MAD``; with MAD = 0, ``(x - median) / (1.253314 x mean |x - median|)``.

    The scale is floored at ``1e-9 (1 + median |x|)`` so that rounding noise
    in a perfectly regular series is not mistaken for an outlier.
    """
    x = np.asarray(values, float)
    if len(x) == 0:
        return x
    dev = x - np.median(x)
    mad = np.median(np.abs(dev))
    scale = mad / 0.6745 if mad > 0 else 1.253314 * np.mean(np.abs(dev))
    return dev / max(scale, 1e-9 * (1.0 + float(np.median(np.abs(x)))))


def spikes(values: Sequence[float], *, threshold: float = SPIKE_Z) -> list[int]:
    """Indices ``i`` (into ``values``) where the jump ``values[i] - values[i-1]`` is a robust outlier.

    A spike that comes back at once makes two outlying jumps of opposite sign;
    it is reported once, at the point that sticks out.

    >>> spikes([1, 1.1, 1, 1.1, 9, 1, 1.1, 1, 1.1])
    [4]
    """
    x = np.asarray(values, float)
    if len(x) < 4:
        return []
    d = np.diff(x)
    flagged = set(np.flatnonzero(np.abs(robust_z(d)) > threshold).tolist())
    out: list[int] = []
    back: set[int] = set()
    for k in sorted(flagged):
        if k in back:
            continue
        out.append(k + 1)
        if k + 1 in flagged and np.sign(d[k + 1]) == -np.sign(d[k]):
            back.add(k + 1)
    return out


def _change(y: np.ndarray) -> float:
    """Fitted change over a window: least-squares slope x (len - 1)."""
    if len(y) < 2:
        return 0.0
    t = np.arange(len(y), dtype=float)
    slope = np.polyfit(t, y, 1)[0]
    return float(slope * (len(y) - 1))


def _fit_start(y: np.ndarray) -> float:
    t = np.arange(len(y), dtype=float)
    slope, icpt = np.polyfit(t, y, 1)
    return float(icpt)


def check_reward_spikes(records: Sequence[dict[str, Any]], *, threshold: float = SPIKE_Z) -> list[TrainingWarning]:
    """A warning per reward series (``charts/return_mean``, ``reward/*``) with spikes."""
    keys = ["charts/return_mean"] + sorted({k for r in rl_records(records) for k in r if k.startswith("reward/")})
    out = []
    for key in keys:
        it, y = series(records, key)
        idx = spikes(y, threshold=threshold)
        if idx:
            at = [int(it[i]) for i in idx]
            out.append(TrainingWarning("reward_spike", key, f"{key} jumped at update(s) {at}",
                                       at[0], at[-1], {"iters": at, "jumps": [float(y[i] - y[i - 1]) for i in idx]}))
    return out


def _aligned(records: Sequence[dict[str, Any]], a: str, b: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ia, ya = series(records, a)
    ib, yb = series(records, b)
    common = np.intersect1d(ia, ib)
    return common, ya[np.isin(ia, common)], yb[np.isin(ib, common)]


def repeat_key(records: Sequence[dict[str, Any]]) -> str | None:
    """The logged signal of repeated actions: ``charts/repeat_rate``, else ``reward/penalty/repeat``."""
    keys = {k for r in rl_records(records) for k in r}
    return next((k for k in ("charts/repeat_rate", "reward/penalty/repeat") if k in keys), None)


def check_collapse(
    records: Sequence[dict[str, Any]],
    *,
    window: int = WINDOW,
    entropy_drop: float = ENTROPY_DROP,
    repeat_rise: float = REPEAT_RISE,
) -> list[TrainingWarning]:
    """Entropy falling while repeated identical actions rise, in some window of ``window`` updates."""
    rkey = repeat_key(records)
    if rkey is None:
        return []
    it, ent, rep = _aligned(records, "losses/entropy", rkey)
    rep = np.abs(rep)
    hits = []
    for s in range(0, len(it) - window + 1):
        e, r = ent[s : s + window], rep[s : s + window]
        start = _fit_start(e)
        drop = -_change(e)
        if start > 0 and drop >= entropy_drop * start and _change(r) >= repeat_rise:
            hits.append((s, drop / start, _change(r)))
    if not hits:
        return []
    s, rel, rise = hits[0]
    return [TrainingWarning(
        "collapse", "losses/entropy",
        f"entropy fell {rel:.0%} while {rkey} rose by {rise:.3f} over updates {int(it[s])}-{int(it[s + window - 1])}"
        + (f" ({len(hits)} windows)" if len(hits) > 1 else ""),
        int(it[s]), int(it[s + window - 1]), {"entropy_drop": rel, "repeat_rise": rise, "repeat_signal": rkey,
                                              "windows": len(hits)})]


_REPEATED_PIECE = re.compile(r"^(.{1,16}?)\1{3,}$", re.DOTALL)


def is_degenerate(text: str, *, min_len: int = 8, dominant: float = 0.6) -> bool:
    """One character making up >= ``dominant`` of the text, or the whole text one short piece repeated >= 4 times.

    >>> is_degenerate("aaaaaaaaaa"), is_degenerate("<|a|><|a|><|a|><|a|>"), is_degenerate("Action: list_tables[{}]")
    (True, True, False)
    """
    s = "".join(text.split())
    if len(s) < min_len:
        return False
    top = max(s.count(c) for c in set(s))
    return top / len(s) >= dominant or bool(_REPEATED_PIECE.match(s))


def check_degenerate_text(actions: Sequence[str], *, share: float = DEGENERATE_SHARE) -> list[TrainingWarning]:
    """Collapse seen in the text itself: too many degenerate actions among ``actions``."""
    if not actions:
        return []
    bad = [a for a in actions if is_degenerate(a)]
    frac = len(bad) / len(actions)
    if frac < share:
        return []
    return [TrainingWarning("collapse", "actions", f"{frac:.0%} of {len(actions)} sampled actions are degenerate "
                            f"(e.g. {bad[0][:60]!r})", evidence={"share": frac, "example": bad[0][:200]})]


def check_reward_hacking(
    records: Sequence[dict[str, Any]],
    *,
    window: int = WINDOW,
    rise_abs: float = HACK_RISE_ABS,
    rise_rel: float = HACK_RISE_REL,
    success_drop: float = HACK_SUCCESS_DROP,
) -> list[TrainingWarning]:
    """A process or sub-goal reward term rising while the success rate falls (one warning per term)."""
    terms = sorted({k for r in rl_records(records) for k in r
                    if k.startswith("reward/process/") or k.startswith("reward/subgoal/")})
    out = []
    for term in terms:
        it, y, succ = _aligned(records, term, "charts/success_rate")
        for s in range(0, len(it) - window + 1):
            yy, ss = y[s : s + window], succ[s : s + window]
            rise, fall = _change(yy), -_change(ss)
            if rise >= max(rise_abs, rise_rel * abs(_fit_start(yy))) and fall >= success_drop:
                out.append(TrainingWarning(
                    "reward_hacking", term,
                    f"{term} rose by {rise:.3f} while success fell by {fall:.3f} over updates "
                    f"{int(it[s])}-{int(it[s + window - 1])}",
                    int(it[s]), int(it[s + window - 1]), {"term_rise": rise, "success_drop": fall}))
                break
    return out


def check_critic_divergence(
    records: Sequence[dict[str, Any]], *, updates: int = DIVERGE_UPDATES, factor: float = DIVERGE_FACTOR
) -> list[TrainingWarning]:
    """The value loss rising at each of ``updates`` consecutive updates (by ``factor`` overall), or not finite."""
    it, y = series(records, "losses/value_loss", finite=False)
    bad = [int(i) for i, v in zip(it, y) if not math.isfinite(v)]
    if bad:
        return [TrainingWarning("critic_divergence", "losses/value_loss",
                                f"value loss is not finite at update(s) {bad[:10]}", bad[0], bad[-1], {"iters": bad})]
    run = 0
    for k in range(1, len(y)):
        run = run + 1 if y[k] > y[k - 1] else 0
        if run >= updates and y[k] >= factor * y[k - run] and y[k - run] >= 0:
            s = k - run
            return [TrainingWarning(
                "critic_divergence", "losses/value_loss",
                f"value loss rose at {run} consecutive updates, {y[s]:.4g} -> {y[k]:.4g} (updates {int(it[s])}-{int(it[k])})",
                int(it[s]), int(it[k]), {"from": float(y[s]), "to": float(y[k]), "updates": run})]
    return []


def check_all(records: Sequence[dict[str, Any]], *, actions: Sequence[str] = ()) -> list[TrainingWarning]:
    """Every check over the log records (and sampled ``actions`` for degenerate text)."""
    return (check_critic_divergence(records) + check_reward_hacking(records) + check_collapse(records)
            + check_degenerate_text(actions) + check_reward_spikes(records))
