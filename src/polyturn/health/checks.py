"""Training-health checks over ``metrics.jsonl`` records: pure functions, thresholds calibrated against noise.

Each check returns :class:`TrainingWarning` s carrying the remedy from the
troubleshooting table of seed 000 (section 4.4), the iterations, the
figures, and the plot that shows them. A metric logged per RL iteration is
a mean over that iteration's episodes and moves by chance; every check
judges a change against that chance movement (:mod:`polyturn.health.signals`:
the robust iteration-to-iteration noise of the series, at least binomial for
a success rate) and asks for a change well beyond it, sustained over a window
(the means of two adjacent windows of ``WINDOW`` iterations, ``z`` standard
errors apart), plus a floor below which a change does not matter.

=====================  ==========================================================================
check                  fires when (defaults)
=====================  ==========================================================================
reward spike           (from ``SPIKE_MIN_ITERS`` = 20 iterations of history on) a one-iteration jump
                       of the return or a reward term is >= ``SPIKE_Z`` = 5
                       robust SDs of its differences and 5 SDs of its sampling noise (payments
                       over ``charts/episodes``), and >= ``SPIKE_MIN_SHARE`` = 20% of the
                       outcome scale (median per-episode sum of ``|reward/outcome/*|``)
reward hacking         a shaping term (not ``outcome/`` or ``penalty/``) rises by >= ``HACK_Z`` = 3
                       s.e. and by >= ``HACK_MIN_SHARE`` = 10% of the outcome scale between two
                       windows (the first may be 3 iterations at the start of the run), while the
                       success rate does not rise by ``HACK_SUCCESS_Z`` = 1 s.e.
judge hacking          the LLM judge's mean score (``judge/score_mean``) rises by >= 3 s.e. and >= 0.1
                       while the success rate does not rise by 1 s.e. (:mod:`polyturn.health.judge`)
collapse               the per-token entropy sits below ``ENTROPY_FLOOR`` = 0.02 nats for a window;
                       or it falls to <= ``ENTROPY_KEEP`` = 50% of its first window (z >= 4)
                       while the episodes repeat themselves (>= ``REPEATED_EPISODES`` = 50% repeated
                       episodes, <= ``DISTINCT_FLOOR`` = 20% distinct actions, or repeated
                       actions at >= 2x their first window and 4 s.e. above it) and success has not
                       risen by ``HACK_SUCCESS_Z`` = 1 s.e. since the first window; or >= 20% of
                       sampled validation actions are degenerate
low diversity          for a window, >= ``REPEATED_EPISODES`` = 50% of an iteration's episodes
                       replay another's actions exactly, or the share of distinct actions falls
                       to <= ``DISTINCT_KEEP`` = 50% of its first window (z >= 4)
oscillation            approx_kl >= ``OSC_KL`` = 0.03 and clipfrac >= ``OSC_CLIPFRAC`` = 0.3 in
                       >= 80% of ``OSC_WINDOW`` = 10 iterations; or success moves between
                       iterations with >= ``OSC_VAR`` = 3x the binomial variance over
                       ``OSC_SUCCESS_WINDOW`` = 20 iterations
plateau                over the last ``PLATEAU_WINDOW`` = 20 iterations neither success nor return
                       rose at all (z <= ``PLATEAU_Z`` = 0) against the 20 before, and explained
                       variance moved < 2 s.e.;
                       or the actor does not move: approx_kl <= ``STALL_KL`` = 1e-7 in every one
                       of the last ``WINDOW`` = 5 updating iterations
critic divergence      the value loss is not finite; or over a window it is >= ``DIVERGE_FACTOR`` = 3x
                       the lowest value of its first window (geometric mean; z >= 4 on a log10
                       scale, where its noise is relative); or the median explained variance of a
                       window is <= ``DIVERGE_EV`` = -1 (worse than a constant guess, twice over)
critic not converging  over the last 2 windows the value loss did not fall by 1 s.e., stays
                       >= ``STUCK_KEEP`` = 50% of its first window, explained variance stays
                       < ``STUCK_EV`` = 0.1, while the return is stable (|z| < 2)
=====================  ==========================================================================

Explained variance is logged as NaN where the returns were nearly constant
(:func:`polyturn.algos.value.ev_ill_conditioned`); :func:`series` drops it, so
no check reads an ill-conditioned figure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polyturn.health.signals import (
    aligned,
    binomial_sd,
    episodes_per_iter,
    noise_sd,
    rate_sd,
    reward_scale,
    rise_without_success,
    rl_records,
    robust_sd,
    series,
    shift,
)
from polyturn.health.judge import check_judge_hacking
from polyturn.health.signals import num as _num  # noqa: F401  (diagnose reads logged values through it)
from polyturn.health.warning import (  # noqa: F401  (re-exported: the checks' public vocabulary)
    PLOTS,
    REMEDIES,
    Kind,
    TrainingWarning,
    format_warning,
    updates_per_iter,
)
from polyturn.health.warning import warning as _w

WINDOW = 5
Z_WARN = 4.0
SPIKE_Z = 5.0
# The robust SD of one-iteration jumps needs this many iterations to mean anything: with 10, a warm-up jump of
# the demo's return (+3.3, 2.3 SDs of its sampling noise) read as 5.7 SDs in the trainer's live check.
SPIKE_MIN_ITERS = 20
SPIKE_MIN_SHARE = 0.2
HACK_MIN_SHARE = 0.1
HACK_Z = 3.0
HACK_SUCCESS_Z = 1.0
ENTROPY_KEEP = 0.5
ENTROPY_FLOOR = 0.02
REPEATED_EPISODES = 0.5
DISTINCT_KEEP = 0.5
DISTINCT_FLOOR = 0.2
DEGENERATE_SHARE = 0.20
OSC_KL = 0.03
OSC_CLIPFRAC = 0.3
OSC_WINDOW = 10
OSC_SHARE = 0.8
OSC_VAR = 3.0
OSC_SUCCESS_WINDOW = 20
PLATEAU_WINDOW = 20
PLATEAU_Z = 0.0
STALL_KL = 1e-7
DIVERGE_FACTOR = 3.0
# A window whose median value loss is this many times the start's best is divergence however noisy the
# series: an erratic blow-up (1e3 one iteration, 1e6 the next) makes its own noise estimate too wide for z.
DIVERGE_HARD = 1000.0
DIVERGE_EV = -1.0
STUCK_KEEP = 0.5
STUCK_EV = 0.1

# ---- reward spikes -------------------------------------------------------------------------------
def robust_z(values: Sequence[float]) -> np.ndarray:
    """``(x - median) / robust_sd(x)`` (scale floored at ``1e-9 (1 + median |x|)`` against rounding noise)."""
    x = np.asarray(values, float)
    if len(x) == 0:
        return x
    dev = x - np.median(x)
    return dev / max(robust_sd(x), 1e-9 * (1.0 + float(np.median(np.abs(x)))))


def spikes(values: Sequence[float], *, threshold: float = SPIKE_Z, min_jump: float = 0.0) -> list[int]:
    """Indices ``i`` where the jump ``values[i] - values[i-1]`` is a robust outlier of at least ``min_jump``.

    A spike that comes back at once makes two outlying jumps of opposite sign;
    it is reported once, at the point that sticks out.

    >>> spikes([1, 1.1, 1, 1.1, 9, 1, 1.1, 1, 1.1])
    [4]
    """
    x = np.asarray(values, float)
    if len(x) < 4:
        return []
    d = np.diff(x)
    z = robust_z(d)
    flagged = set(np.flatnonzero((np.abs(z) > threshold) & (np.abs(d) >= min_jump)).tolist())
    out: list[int] = []
    back: set[int] = set()
    for k in sorted(flagged):
        if k in back:
            continue
        out.append(k + 1)
        if k + 1 in flagged and np.sign(d[k + 1]) == -np.sign(d[k]):
            back.add(k + 1)
    return out


def reward_keys(records: Sequence[dict[str, Any]]) -> list[str]:
    """``charts/return_mean`` and every ``reward/*`` term logged."""
    return ["charts/return_mean"] + sorted({k for r in rl_records(records) for k in r if k.startswith("reward/")})


def payment_sd(y: np.ndarray, n: int | None) -> np.ndarray:
    """Sampling noise of each jump ``y[i] - y[i-1]`` of a per-episode mean of payments, from the payments' size.

    A term paid ``w`` per event, ``|m| / w`` times per episode on average, has a mean over ``n``
    episodes with variance about ``w |m| / n`` (Poisson); ``w`` is taken as the largest level the
    series reaches. A series that is flat but for a few episodes' worth of change (3 of 8 episodes
    submitting instead of timing out) therefore does not make a spike. Zeros when ``n`` is unknown.
    """
    if not n or len(y) < 2:
        return np.zeros(max(0, len(y) - 1))
    w = float(np.abs(y).max())
    return np.sqrt(w * (np.abs(y[1:]) + np.abs(y[:-1])) / n)


def check_reward_spikes(records: Sequence[dict[str, Any]], *, threshold: float = SPIKE_Z,
                        min_share: float = SPIKE_MIN_SHARE) -> list[TrainingWarning]:
    """A warning per reward series with one-iteration jumps far beyond its noise and large enough to matter.

    The noise of a jump is the larger of the series' robust SD of jumps and its sampling noise (:func:`payment_sd`).
    """
    floor = min_share * reward_scale(records)
    n = episodes_per_iter(records)
    out = []
    for key in reward_keys(records):
        it, y = series(records, key)
        if len(y) < SPIKE_MIN_ITERS:
            continue
        idx = spikes(y, threshold=threshold, min_jump=floor)
        sampling = payment_sd(y, n)
        idx = [i for i in idx if sampling[i - 1] == 0 or abs(y[i] - y[i - 1]) >= threshold * sampling[i - 1]]
        if idx:
            at = [int(it[i]) for i in idx]
            jumps = [float(y[i] - y[i - 1]) for i in idx]
            d = np.diff(y)
            sd = np.maximum(robust_sd(d), sampling[[i - 1 for i in idx]])
            z = [abs(j - float(np.median(d))) / s if s > 0 else math.inf for j, s in zip(jumps, sd)]
            out.append(_w("reward_spike", key,
                          f"{key} jumped by {', '.join(f'{j:+.3g}' for j in jumps)} per episode at iteration(s) {at} "
                          f"({min(z):.1f}+ SDs of its noise; thresholds {threshold:g} SDs and {floor:.3g})",
                          at[0], at[-1], iters=at, jumps=jumps, z=z))
    return out


# ---- reward hacking ------------------------------------------------------------------------------
def check_reward_hacking(records: Sequence[dict[str, Any]], *, window: int = WINDOW, z_warn: float = HACK_Z,
                         min_share: float = HACK_MIN_SHARE, success_z: float = HACK_SUCCESS_Z) -> list[TrainingWarning]:
    """A shaping term (not ``outcome/``, not ``penalty/``, not the LLM judge's: :func:`check_judge_hacking`) rising
    far beyond noise while success does not rise (:func:`polyturn.health.signals.rise_without_success`)."""
    terms = [k for k in reward_keys(records)[1:]
             if not k.startswith(("reward/outcome/", "reward/penalty/", "reward/judge/"))]
    floor = min_share * reward_scale(records)
    out = []
    for term in terms:
        it, r = rise_without_success(records, term, floor=floor, window=window, z_warn=z_warn, success_z=success_z)
        if r is not None:
            t, p = r.metric, r.success
            a, b = int(it[r.s - r.before]), int(it[min(len(it), r.s + window) - 1])
            out.append(_w("reward_hacking", term,
                          f"{term} rose {t.before:.3g} -> {t.after:.3g} per episode ({t.change:+.3g}, {t.z:.1f} s.e.) "
                          f"from iterations {a}-{int(it[r.s - 1])} to {int(it[r.s])}-{b}, while the success rate went "
                          f"{p.before:.3f} -> {p.after:.3f} ({p.z:+.1f} s.e.); {r.windows} window(s)",
                          a, b, term_before=t.before, term_after=t.after, term_z=t.z, success_before=p.before,
                          success_after=p.after, success_z=p.z, windows=r.windows))
    return out


# ---- collapse and diversity ----------------------------------------------------------------------
def repeat_key(records: Sequence[dict[str, Any]]) -> str | None:
    """The logged signal of repeated actions: ``charts/repeat_rate``, else ``reward/penalty/repeat``."""
    keys = {k for r in rl_records(records) for k in r}
    return next((k for k in ("charts/repeat_rate", "reward/penalty/repeat") if k in keys), None)


def _repetition(records: Sequence[dict[str, Any]], a: int, b: int, window: int,
                z_warn: float = Z_WARN) -> tuple[str, float] | None:
    """Evidence that the episodes of iterations ``[a, b]`` repeat themselves: ``(signal, level)``, or None.

    Repeated whole episodes >= ``REPEATED_EPISODES``; distinct actions <=
    ``DISTINCT_FLOOR``; or repeated actions (``repeat_key``) at >= 2x their
    first window and ``z_warn`` s.e. above it.
    """
    for key, test in (("charts/repeated_episode_frac", lambda v: v >= REPEATED_EPISODES),
                      ("charts/distinct_action_frac", lambda v: v <= DISTINCT_FLOOR)):
        it, y = series(records, key)
        inside = (it >= a) & (it <= b)
        if inside.any() and test(float(y[inside].mean())):
            return key, float(y[inside].mean())
    key = repeat_key(records)
    if key is not None:
        it, y = series(records, key)
        y = np.abs(y)
        inside = (it >= a) & (it <= b)
        if len(y) >= 2 * window and inside.any():
            first, level = float(y[:window].mean()), float(y[inside].mean())
            se = noise_sd(y) * math.sqrt(2 / window)
            if level >= 2 * first and level - first >= z_warn * se and level > first:
                return key, level
    return None


def check_collapse(records: Sequence[dict[str, Any]], *, window: int = WINDOW, z_warn: float = Z_WARN,
                   keep: float = ENTROPY_KEEP, floor: float = ENTROPY_FLOOR,
                   success_z: float = HACK_SUCCESS_Z) -> list[TrainingWarning]:
    """Entropy below ``floor`` for a window (the policy samples deterministically), or fallen to ``keep`` of its
    first window beyond noise while the episodes repeat themselves and success does not rise.

    A policy that sharpens while it succeeds more often is what RL is for: on the demo run the entropy fell
    0.34 -> 0.06 nats per token and repeated calls rose for a while as success went 0.33 -> 0.62, and that
    is no collapse (``success_z``: success must not have risen by that many s.e. since the first window).
    """
    it, ent = series(records, "losses/entropy")
    if len(it) < window:
        return []
    sd = noise_sd(ent)
    start = float(ent[:window].mean())
    s_it, succ = series(records, "charts/success_rate")
    succ_se = rate_sd(records, succ) * math.sqrt(2 / window) if len(succ) else 0.0
    succ_start = float(succ[:window].mean()) if len(succ) else 0.0

    def success_rose(a: int, b: int) -> bool:
        inside = (s_it >= a) & (s_it <= b)
        return bool(inside.any()) and succ_se > 0 and (float(succ[inside].mean()) - succ_start) / succ_se >= success_z

    for s in range(0, len(it) - window + 1):
        level = float(ent[s : s + window].mean())
        a, b = int(it[s]), int(it[s + window - 1])
        se = sd * math.sqrt(2 / window) or 1e-12
        dropped = s >= window and level <= keep * start and (start - level) / se >= z_warn
        if not (dropped or level < floor):
            continue  # (the repetition evidence is read only for a window that may warn: it scans the whole log)
        rep = _repetition(records, a, b, window)
        fell = dropped and rep is not None and not success_rose(a, b)
        if not (fell or level < floor):
            continue
        why = (f"fell from {start:.3g} to {level:.3g} nats per token" if fell else
               f"stayed at {level:.3g} nats per token (below {floor:g}: sampling is almost deterministic)")
        repeats = f" while the episodes repeat ({rep[0]} = {rep[1]:.3g})" if rep else ""
        return [_w("collapse", "losses/entropy", f"entropy {why} over iterations {a}-{b}{repeats}", a, b,
                   entropy_start=start, entropy=level, repeat_signal=rep[0] if rep else None,
                   repeat_level=rep[1] if rep else None)]
    return []


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
    return [_w("collapse", "actions", f"{frac:.0%} of {len(actions)} sampled validation actions are degenerate "
               f"(e.g. {bad[0][:60]!r})", None, None, share=frac, example=bad[0][:200])]


def check_low_diversity(records: Sequence[dict[str, Any]], *, window: int = WINDOW, z_warn: float = Z_WARN,
                        repeated: float = REPEATED_EPISODES, keep: float = DISTINCT_KEEP) -> list[TrainingWarning]:
    """Whole episodes replayed within an iteration, or the share of distinct actions collapsing."""
    out = []
    n = episodes_per_iter(records)
    it, rep = series(records, "charts/repeated_episode_frac")
    for s in range(0, len(it) - window + 1):
        level = float(rep[s : s + window].mean())
        if level >= repeated:
            a, b = int(it[s]), int(it[s + window - 1])
            out.append(_w("low_diversity", "charts/repeated_episode_frac",
                          f"{level:.0%} of each iteration's episodes{f' (of {n})' if n else ''} replayed another "
                          f"episode's actions exactly over iterations {a}-{b} (threshold {repeated:.0%})",
                          a, b, repeated_episode_frac=level))
            break
    it, dist = series(records, "charts/distinct_action_frac")
    if len(it) >= 2 * window:
        sd = rate_sd(records, dist)
        for s in range(window, len(it) - window + 1):
            d = shift(dist, s, window, sd)
            start = float(dist[:window].mean())
            z = (start - d.after) / d.se if d.se > 0 else (math.inf if start > d.after else 0.0)
            if d.after <= keep * start and z >= z_warn:
                a, b = int(it[s]), int(it[s + window - 1])
                out.append(_w("low_diversity", "charts/distinct_action_frac",
                              f"distinct actions fell from {start:.2f} to {d.after:.2f} of all actions over "
                              f"iterations {a}-{b} ({z:.1f} s.e.)", a, b, first=start, level=d.after, z=z))
                break
    return out


# ---- oscillation and plateau ---------------------------------------------------------------------
def check_oscillation(records: Sequence[dict[str, Any]], *, window: int = OSC_WINDOW, kl: float = OSC_KL,
                      clipfrac: float = OSC_CLIPFRAC, share: float = OSC_SHARE, var_ratio: float = OSC_VAR,
                      success_window: int = OSC_SUCCESS_WINDOW) -> list[TrainingWarning]:
    """PPO steps too large for many iterations, or success swinging far more than binomial noise allows."""
    out = []
    it, k, c = aligned(records, "losses/approx_kl", "losses/clipfrac")
    for s in range(0, len(it) - window + 1):
        high = (k[s : s + window] >= kl) & (c[s : s + window] >= clipfrac)
        if high.mean() >= share:
            a, b = int(it[s]), int(it[s + window - 1])
            out.append(_w("oscillation", "losses/approx_kl",
                          f"approx_kl >= {kl:g} and clipfrac >= {clipfrac:g} in {int(high.sum())} of {window} "
                          f"iterations {a}-{b} (median approx_kl {np.median(k[s:s + window]):.3g}, clipfrac "
                          f"{np.median(c[s:s + window]):.3g})", a, b, high=int(high.sum()),
                          approx_kl=float(np.median(k[s : s + window])), clipfrac=float(np.median(c[s : s + window]))))
            break
    n = episodes_per_iter(records)
    it, y = series(records, "charts/success_rate")
    if n:
        for s in range(0, len(it) - success_window + 1):
            w = y[s : s + success_window]
            expected = 2 * binomial_sd(float(w.mean()), n) ** 2  # variance of a difference of two noisy rates
            ratio = float(np.mean(np.diff(w) ** 2)) / expected
            if ratio >= var_ratio:
                a, b = int(it[s]), int(it[s + success_window - 1])
                out.append(_w("oscillation", "charts/success_rate",
                              f"success swung up and down over iterations {a}-{b}: its changes have {ratio:.1f}x the "
                              f"variance that {n} episodes per iteration explain (threshold {var_ratio:g}x; range "
                              f"{w.min():.2f}-{w.max():.2f})", a, b, variance_ratio=ratio))
                break
    return out


def check_plateau(records: Sequence[dict[str, Any]], *, window: int = PLATEAU_WINDOW, stall_window: int = WINDOW,
                  stall_kl: float = STALL_KL, updates_per_iter: int | None = None) -> list[TrainingWarning]:
    """The end of the run stopped improving (success, return and explained variance flat), or the actor is stalled.

    ``updates_per_iter`` (actor optimizer steps per iteration) is needed for
    the stall test: with one step, approx_kl is measured before it and is 0
    by construction. A minibatch the KL limit declined moved no weights but
    shows the steps before it did: the test reads the larger of the stepped
    minibatches' mean and its approx_kl (``losses/declined_approx_kl``).
    """
    out = []
    if updates_per_iter is not None and updates_per_iter >= 2:
        moved = [{**r, "losses/approx_kl": max(r.get("losses/approx_kl", 0.0), r["losses/declined_approx_kl"])}
                 if "losses/declined_approx_kl" in r else r for r in records]
        it, k = series(moved, "losses/approx_kl")
        if len(it) >= stall_window and np.all(np.abs(k[-stall_window:]) <= stall_kl):
            a, b = int(it[-stall_window]), int(it[-1])
            out.append(_w("plateau", "losses/approx_kl",
                          f"the actor does not move: approx_kl <= {stall_kl:g} at every one of iterations {a}-{b} "
                          f"({updates_per_iter} updates per iteration; max {np.abs(k[-stall_window:]).max():.3g})",
                          a, b, max_approx_kl=float(np.abs(k[-stall_window:]).max())))
    it, succ, ret = aligned(records, "charts/success_rate", "charts/return_mean")
    if len(it) >= 2 * window:
        s = len(it) - window
        p, r = shift(succ, s, window, rate_sd(records, succ)), shift(ret, s, window, noise_sd(ret))
        ev_it, ev = series(records, "losses/explained_variance")
        ev_flat, ev_text = True, ""
        if len(ev_it) >= 2 * window:
            e = shift(ev, len(ev) - window, window, noise_sd(ev))
            ev_flat, ev_text = abs(e.z) < 2, f", explained variance {e.before:.2f} -> {e.after:.2f} ({e.z:+.1f} s.e.)"
        if p.z <= PLATEAU_Z and r.z <= PLATEAU_Z and ev_flat:
            a, b = int(it[s - window]), int(it[-1])
            out.append(_w("plateau", "charts/success_rate",
                          f"no improvement over iterations {int(it[s])}-{b} against {a}-{int(it[s - 1])}: success "
                          f"{p.before:.3f} -> {p.after:.3f} ({p.z:+.1f} s.e.), return {r.before:.3g} -> {r.after:.3g} "
                          f"({r.z:+.1f} s.e.){ev_text}", a, b, success_z=p.z, return_z=r.z))
    return out


# ---- the critic ----------------------------------------------------------------------------------
def check_critic_divergence(records: Sequence[dict[str, Any]], *, window: int = WINDOW, z_warn: float = Z_WARN,
                            factor: float = DIVERGE_FACTOR, ev_floor: float = DIVERGE_EV) -> list[TrainingWarning]:
    """The value loss non-finite or far above where it started, or explained variance far below 0, for a window."""
    it, y = series(records, "losses/value_loss", finite=False)
    bad = [int(i) for i, v in zip(it, y) if not math.isfinite(v)]
    if bad:
        return [_w("critic_divergence", "losses/value_loss", f"value loss is not finite at iteration(s) {bad[:10]}",
                   bad[0], bad[-1], iters=bad)]
    if len(it) >= 2 * window:
        # On a log scale: a diverging loss grows by factors, and its noise is relative to its size.
        logv = np.log10(np.maximum(y, 1e-12))
        sd = noise_sd(logv)
        first = float(y[:window].min())  # the best the critic did at the start
        for s in range(window, len(it) - window + 1):
            d = shift(logv, s, window, sd)
            rise = d.after - math.log10(max(first, 1e-12))
            z = rise / d.se if d.se > 0 else (math.inf if rise > 0 else 0.0)
            level = float(np.median(y[s : s + window]))
            blown_up = level >= DIVERGE_HARD * max(first, 1e-12)
            if rise >= math.log10(factor) and (z >= z_warn or blown_up):
                a, b = int(it[s]), int(it[s + window - 1])
                return [_w("critic_divergence", "losses/value_loss",
                           f"value loss rose from {first:.3g} (the lowest of iterations {int(it[0])}-"
                           f"{int(it[window - 1])}) to a median of {level:.3g} over iterations {a}-{b} "
                           f"({10 ** rise:.3g}x on average, {z:.1f} s.e. on a log scale)",
                           a, b, first=first, level=level, factor=10**rise, z=z)]
    it, ev = series(records, "losses/explained_variance")
    for s in range(0, len(it) - window + 1):
        med = float(np.median(ev[s : s + window]))
        if med <= ev_floor:
            a, b = int(it[s]), int(it[s + window - 1])
            return [_w("critic_divergence", "losses/explained_variance",
                       f"explained variance has median {med:.3g} over iterations {a}-{b} (<= {ev_floor:g}: the "
                       "critic's errors vary more than twice as much as the returns)", a, b, median_ev=med)]
    return []


def check_critic_not_converging(records: Sequence[dict[str, Any]], *, window: int = WINDOW, keep: float = STUCK_KEEP,
                                ev_max: float = STUCK_EV) -> list[TrainingWarning]:
    """The value loss flat or rising at a high level, explained variance low, while the return is stable."""
    it, vl, ret = aligned(records, "losses/value_loss", "charts/return_mean")
    if len(it) < 3 * window:
        return []
    s = len(it) - window
    v, r = shift(vl, s, window, noise_sd(vl)), shift(ret, s, window, noise_sd(ret))
    first = float(vl[:window].mean())
    ev_it, ev = series(records, "losses/explained_variance")
    ev_last = float(np.mean(ev[-window:])) if len(ev) >= window else None
    if v.z > -1 and v.after >= keep * first and abs(r.z) < 2 and ev_last is not None and ev_last < ev_max:
        a, b = int(it[s - window]), int(it[-1])
        return [_w("critic_not_converging", "losses/value_loss",
                   f"value loss {v.before:.3g} -> {v.after:.3g} ({v.z:+.1f} s.e.) over iterations {a}-{b}, still "
                   f"{v.after / first:.0%} of where it started, explained variance {ev_last:.2f}, while the return "
                   f"held steady ({r.before:.3g} -> {r.after:.3g}, {r.z:+.1f} s.e.)", a, b,
                   value_loss_z=v.z, explained_variance=ev_last, return_z=r.z)]
    return []


def check_all(records: Sequence[dict[str, Any]], *, actions: Sequence[str] = (),
              updates_per_iter: int | None = None) -> list[TrainingWarning]:
    """Every check over the log records (and sampled ``actions`` for degenerate text)."""
    return (check_critic_divergence(records) + check_critic_not_converging(records) + check_reward_hacking(records)
            + check_judge_hacking(records) + check_collapse(records) + check_degenerate_text(actions)
            + check_low_diversity(records)
            + check_oscillation(records) + check_plateau(records, updates_per_iter=updates_per_iter)
            + check_reward_spikes(records))


def new_warnings(records: Sequence[dict[str, Any]], *, updates_per_iter: int, seen: list[str], plot_dir: Path,
                 drawn_by: str) -> list[str]:
    """The formatted warnings of :func:`check_all` on ``records`` not already in ``seen`` (``kind:metric`` keys,
    added to it here): what a training run reports as its log grows."""
    new = []
    for w in check_all(records, updates_per_iter=updates_per_iter):
        if f"{w.kind}:{w.metric}" not in seen:
            seen.append(f"{w.kind}:{w.metric}")
            new.append(format_warning(w, plot_dir=plot_dir, drawn_by=drawn_by))
    return new
