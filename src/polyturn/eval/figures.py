"""Matplotlib figures of an evaluation, as PNG bytes (the Agg backend: no display needed).

Each function takes plain per-policy data (the report's data structure) so
the figures and the tables show the same numbers.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from polyturn.eval.stats import wilson_interval  # noqa: E402


def to_png(fig: plt.Figure, *, dpi: int = 90, tight: bool = True) -> bytes:
    """Render and close a figure; ``tight``: cropped to what is drawn (one more layout pass: a figure laid out by
    ``tight_layout`` already fits, and ~1 s of a 24-panel figure's ~2 s went to it)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return buf.getvalue()


def _colors(n: int) -> list:
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def success_by_level(by_level: Mapping[str, Mapping[int, tuple[int, int]]]) -> bytes:
    """Grouped bars: success rate per difficulty level and policy, with 95% Wilson error bars.

    ``by_level[policy][level] = (successes, episodes)``.
    """
    policies = list(by_level)
    levels = sorted({lv for d in by_level.values() for lv in d})
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(levels) * max(1, len(policies)) * 0.6 + 2), 3.4))
    width = 0.8 / max(1, len(policies))
    for j, (p, c) in enumerate(zip(policies, _colors(len(policies)))):
        xs, ys, err = [], [], [[], []]
        for i, lv in enumerate(levels):
            k, n = by_level[p].get(lv, (0, 0))
            if n == 0:
                continue
            lo, hi = wilson_interval(k, n)
            xs.append(i + (j - (len(policies) - 1) / 2) * width)
            ys.append(k / n)
            err[0].append(max(0.0, k / n - lo))
            err[1].append(max(0.0, hi - k / n))
        ax.bar(xs, ys, width, yerr=err, capsize=3, color=c, label=p)
    ax.set_xticks(range(len(levels)), [f"level {lv}" for lv in levels])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate")
    ax.set_title("Success by difficulty level (95% Wilson CI)")
    ax.legend(fontsize=8)
    return to_png(fig)


def turn_histograms(turns: Mapping[str, Sequence[int]]) -> bytes:
    """One histogram of episode length (agent turns) per policy, on shared bins."""
    policies = list(turns)
    top = max([max(v) for v in turns.values() if len(v)] + [1])
    bins = np.arange(0.5, top + 1.5)
    fig, axes = plt.subplots(1, max(1, len(policies)), figsize=(3.2 * max(1, len(policies)), 2.8), sharey=True,
                             squeeze=False)
    for ax, p, c in zip(axes[0], policies, _colors(len(policies))):
        ax.hist(turns[p], bins=bins, color=c)
        ax.set_title(p, fontsize=9)
        ax.set_xlabel("turns")
    axes[0][0].set_ylabel("episodes")
    fig.suptitle("Turns per episode")
    return to_png(fig)


def reward_terms(terms: Mapping[str, Mapping[str, float]]) -> bytes:
    """Horizontal grouped bars: each reward term's mean per episode, per policy."""
    policies = list(terms)
    names = sorted({k for d in terms.values() for k in d})
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(3, len(names)) * max(1, len(policies)) ** 0.5 + 1.2))
    height = 0.8 / max(1, len(policies))
    for j, (p, c) in enumerate(zip(policies, _colors(len(policies)))):
        ys = [i + (j - (len(policies) - 1) / 2) * height for i in range(len(names))]
        ax.barh(ys, [terms[p].get(n, 0.0) for n in names], height, color=c, label=p)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.axvline(0, color="black", lw=0.6)
    ax.invert_yaxis()
    ax.set_xlabel("mean per episode")
    ax.set_title("Reward-term breakdown")
    ax.legend(fontsize=8)
    return to_png(fig)


def latency_distribution(latencies: Mapping[str, Sequence[float]]) -> bytes:
    """Per-policy box plots of per-turn latency (log scale) with p50/p95/p99 marks."""
    policies = [p for p in latencies if len(latencies[p])]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(policies) + 2), 3.2))
    if policies:
        data = [np.maximum(np.asarray(latencies[p], float), 1e-6) for p in policies]
        ax.boxplot(data, showfliers=True, whis=(5, 95))
        for i, d in enumerate(data, 1):
            for q, m in ((50, "_"), (95, "x"), (99, "^")):
                ax.plot([i], [np.percentile(d, q)], marker=m, color="crimson", ms=7)
        ax.set_xticks(range(1, len(policies) + 1), policies, fontsize=8)
        ax.set_yscale("log")
    ax.set_ylabel("seconds per turn")
    ax.set_title("Latency per turn (whiskers p5-p95; marks p50 _, p95 x, p99 ^)")
    return to_png(fig)
