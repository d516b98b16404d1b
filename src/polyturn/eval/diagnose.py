"""``polyturn diagnose``: training curves, a critic check, and warnings with remedies.

From a run directory:

1. **Curves** from ``metrics.jsonl``: the return and every reward term per
   update with spikes marked (:func:`polyturn.health.checks.spikes`), success
   rate, value loss, explained variance, approx_kl, clipfrac, entropy.
2. **Critic check** on fresh validation episodes: the checkpoint's actor
   plays held-out seeds from ``env.eval_seed_start`` (never trained on) at the
   evaluation temperature; the checkpoint's critic scores every turn. Reported:
   MSE and explained variance of V(s_t) against the realised discounted
   return-to-go ``G_t`` (gamma = the end of the run's gamma schedule; when
   the returns are nearly constant the explained variance is ill-conditioned
   and is not shown, :func:`polyturn.algos.value.ev_ill_conditioned`), a
   calibration plot (V binned by quantile vs mean G), and, for two whole
   episodes, each turn's reward, ``G_t``, TD target ``r_t + gamma V(s_{t+1})``
   (0 after termination, V of the final state after truncation) and V(s_t) —
   the manual check that seed 000 (4.4) prescribes when the critic diverges.
3. **Warnings** (:mod:`polyturn.health.checks`) with the seed's remedies.
4. **Held-out: BC against final**, when the run wrote both held-out evaluations (``eval_bc.jsonl`` and
   ``eval_final.jsonl``, and their ``_sampled`` twins): success, return, turns and invalid actions of each,
   paired on the same task seeds: how many tasks the final policy gained and lost, the exact sign test, and
   success by task level where the records have one (:mod:`polyturn.eval.held_out`). Nothing reruns.
5. **Constraints**, for a constrained run (``constraint/*`` keys in the log): each cost term's cost, limit,
   margin and Lagrange multiplier (:mod:`polyturn.eval.constraints`).

Writes ``diagnose.md``, ``diagnose.json`` and PNGs to ``--out`` (default ``<run>/diagnose``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polyturn.acting.checkpoint import held_out_tasks, load_checkpoint, run_actor
from polyturn.acting.policies import resolve_policy
from polyturn.algos.value import EV_MIN_REL_VAR, EV_MIN_VAR, ev_ill_conditioned, explained_variance
from polyturn.config import ConfigError, load_config
from polyturn.eval.constraints import constraint_blocks, curve_keys, summarize_constraints
from polyturn.eval.document import Block, Bullets, Code, Heading, Image, Para, Table, to_markdown, write_images
from polyturn.eval.embed import torch_threads
from polyturn.eval.held_out import HeldOutComparison, held_out_blocks, held_out_comparisons
from polyturn.health import checks as C
from polyturn.health.signals import read_records, reward_scale
from polyturn.rollout.types import Episode
from polyturn.runtime import describe_machine

CURVES = ("charts/success_rate", "losses/value_loss", "losses/explained_variance", "losses/approx_kl",
          "losses/clipfrac", "losses/entropy", "charts/distinct_action_frac", "charts/repeated_episode_frac",
          "critic/pair_acc", "critic/pair_acc_first_diff", "critic/branch_acc")
#: The action-level critic's held-out pairwise accuracies, each with the count that weights it: over whole
#: attempts, at the first turn where two attempts differ, and on branches from one state (critic.branch_states).
PAIR_ACC = {"critic/pair_acc": "critic/pairs", "critic/pair_acc_first_diff": "critic/pairs",
            "critic/branch_acc": "critic/branch_pairs"}


def pair_accuracy_summary(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The action critic's held-out pairwise accuracies over the whole run, each iteration weighted by its pairs.

    Each iteration's accuracy was measured on its own episodes before the critic trained on them (never seen).
    Empty for a run without an action-level critic.
    """
    out: dict[str, float] = {}
    rl = C.rl_records(records)
    for key, count in PAIR_ACC.items():
        rows = [(C._num(r.get(key)), C._num(r.get(count)) or 0.0) for r in rl if key in r]
        rows = [(v, n) for v, n in rows if v is not None and n > 0]
        if rows:
            out[key] = sum(v * n for v, n in rows) / sum(n for _, n in rows)
            out[f"{key}/last"] = rows[-1][0]
            out[count] = sum(C._num(r.get(count)) or 0.0 for r in rl)
    return out


@dataclass
class CriticCheck:
    """The critic's predictions against realised returns on validation episodes.

    ``explained_variance`` is None when it is undefined: no turns, or returns too nearly constant
    (``returns_var``, their variance, is ill-conditioned: :func:`polyturn.algos.value.ev_ill_conditioned`).
    """

    checkpoint: str
    episodes: int
    gamma: float
    mse: float
    explained_variance: float | None
    values: list[float] = field(repr=False)
    returns: list[float] = field(repr=False)
    tables: list[tuple[str, list[dict[str, Any]]]] = field(repr=False)
    actions: list[str] = field(repr=False)
    returns_var: float = math.nan
    returns_mean: float = math.nan

    def explained_variance_text(self) -> str:
        """The explained variance to 3 decimals, or why there is none (ill-conditioned: the variance it divides by)."""
        if self.explained_variance is not None:
            return f"{self.explained_variance:.3f}"
        if not self.returns:
            return "n/a (no turns)"
        if not ev_ill_conditioned(self.returns_var, self.returns_mean):
            return "n/a (not finite)"
        floor = max(EV_MIN_VAR, EV_MIN_REL_VAR * self.returns_mean**2)
        return (f"ill-conditioned, not shown: the returns are nearly constant (Var(G) = {self.returns_var:.3g} < "
                f"{floor:.3g} = max({EV_MIN_VAR:g}, {EV_MIN_REL_VAR:g} x mean(G)^2), "
                f"mean(G) = {self.returns_mean:.4g})")


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Realised return-to-go ``G_t = r_t + gamma G_{t+1}`` (no bootstrap).

    >>> discounted_returns([1.0, 0.0, 2.0], 0.5)
    [1.5, 1.0, 2.0]
    """
    out, g = [], 0.0
    for r in reversed(rewards):
        g = r + gamma * g
        out.append(g)
    return out[::-1]


def calibration_bins(values: Sequence[float], returns: Sequence[float], *, bins: int = 10) -> list[tuple[float, float, int]]:
    """``(mean V, mean G, count)`` per quantile bin of V (fewer bins when values repeat)."""
    v, g = np.asarray(values, float), np.asarray(returns, float)
    if len(v) == 0:
        return []
    edges = np.unique(np.quantile(v, np.linspace(0, 1, min(bins, len(v)) + 1)))
    idx = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, max(0, len(edges) - 2))
    return [(float(v[idx == b].mean()), float(g[idx == b].mean()), int((idx == b).sum()))
            for b in range(max(1, len(edges) - 1)) if (idx == b).any()]


def pick_checkpoint(run: Path, name: str | None) -> Path | None:
    """``run/name``, else the checkpoint named by ``run/latest``, else the last ``ckpt-*``; None if none."""
    if name:
        path = run / name
        if not (path / "actor").is_dir():
            raise FileNotFoundError(f"Expected a checkpoint {path} holding actor/, found none")
        return path
    if (run / "latest").is_file():
        path = run / (run / "latest").read_text().strip()
        if (path / "actor").is_dir():
            return path
    found = sorted(p for p in run.glob("ckpt-*") if (p / "actor").is_dir() and not p.name.endswith(".tmp"))
    return found[-1] if found else None


#: ``(checkpoint dir, its config, its actor, episodes) -> (values, next_values)``, each ``[E, T]``: the checkpoint's
#: critic on the episodes' turns (:func:`polyturn.train.critic_check.critic_values`; evaluation never imports the
#: trainer, so the command line hands it in).
CriticValues = Callable[[Path, Any, Any, Sequence[Any]], tuple[Any, Any]]


def critic_check(ckpt: Path, *, episodes: int, critic_values: CriticValues,
                 progress: Callable[[int], None] | None = None, seed: int = 0) -> CriticCheck | None:
    """Run the checkpoint's actor on held-out seeds and compare its critic with realised returns.

    None for ``critic.kind: none`` and ``action`` (no state values to check).
    """
    spec = resolve_policy(str(ckpt))
    cfg = spec.config
    assert cfg is not None
    if cfg.critic.kind in ("none", "action"):
        return None  # no state values to check (an action critic's check is its pairwise accuracy)
    loaded = load_checkpoint(spec)
    with torch_threads(1):
        eps = run_actor(loaded, held_out_tasks(cfg, episodes), temperature=cfg.rollout.eval_temperature, seed=seed,
                        label=ckpt.name, progress=progress, num_envs=cfg.rollout.num_envs)
        # A hierarchical checkpoint's actor is its worker, whose critic lies beside it (roles/worker/).
        values, next_values = critic_values(loaded.actor_dir.parent if loaded.manager else ckpt, cfg, loaded.actor, eps)
    return compare_to_returns(eps, values, next_values, gamma=cfg.curriculum.gamma.end,
                              reward_scale=cfg.ppo.reward_scale, checkpoint=str(ckpt))


def compare_to_returns(eps: Sequence[Episode], values: torch.Tensor, next_values: torch.Tensor, *, gamma: float,
                       reward_scale: float, checkpoint: str) -> CriticCheck:
    """The critic's ``[E, T]`` values against each episode's realised return-to-go, in the env's reward units.

    The critic learnt values of ``ppo.reward_scale``-scaled returns, so its
    values are divided by ``reward_scale`` before they meet the raw returns.
    """
    values, next_values = values / reward_scale, next_values / reward_scale
    v_all, g_all, tables = [], [], []
    for i, ep in enumerate(eps):
        rewards = [t.reward for t in ep.turns]
        g = discounted_returns(rewards, gamma)
        v_all += [float(values[i, t]) for t in range(len(ep.turns))]
        g_all += g
        if len(tables) < 2:
            rows = [{"turn": t, "action_type": str(turn.info.get("action_type", "")), "reward": turn.reward,
                     "G": g[t], "td_target": turn.reward + gamma * float(next_values[i, t]), "V": float(values[i, t])}
                    for t, turn in enumerate(ep.turns)]
            end = "success" if ep.success else ("truncated" if ep.truncated else "failure")
            tables.append((f"seed {ep.seed} ({ep.task_id}, {end})", rows))
    v, g = np.array(v_all), np.array(g_all)
    g_var, g_mean = (float(g.var()), float(g.mean())) if len(g) else (math.nan, math.nan)
    ev = float(explained_variance(torch.from_numpy(v), torch.from_numpy(g), torch.ones(len(v), dtype=torch.bool)))
    return CriticCheck(checkpoint=checkpoint, episodes=len(eps), gamma=gamma,
                       mse=float(((v - g) ** 2).mean()) if len(v) else math.nan,
                       explained_variance=ev if math.isfinite(ev) else None, values=v_all, returns=g_all, tables=tables,
                       actions=[t.action for ep in eps for t in ep.turns], returns_var=g_var, returns_mean=g_mean)


# ---- figures ---------------------------------------------------------------------------------------
def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _curve(ax: Any, records: Sequence[dict[str, Any]], key: str, *, mark_spikes: bool) -> None:
    it, y = C.series(records, key)
    ax.plot(it, y, lw=1.2)
    if mark_spikes and len(y):
        idx = C.spikes(y, min_jump=C.SPIKE_MIN_SHARE * reward_scale(records))
        ax.plot(it[idx], y[idx], "o", color="crimson", ms=6, label="spike" if idx else None)
        if idx:
            ax.legend(fontsize=7)
    ax.set_title(key, fontsize=8)
    ax.tick_params(labelsize=7)


def curves_png(records: Sequence[dict[str, Any]], keys: Sequence[str], *, title: str, mark_spikes: bool) -> bytes:
    """Small multiples of ``keys`` over RL updates (spikes marked red when ``mark_spikes``)."""
    from polyturn.eval.figures import to_png

    plt = _plt()
    n = max(1, len(keys))
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        _curve(ax, records, key, mark_spikes=mark_spikes)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    return to_png(fig, tight=False)


def calibration_png(check: CriticCheck) -> bytes:
    """V(s_t) against the realised return-to-go: binned means, with the diagonal."""
    from polyturn.eval.figures import to_png

    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.2, 4))
    ax.scatter(check.values, check.returns, s=6, alpha=0.25, color="gray", label="turns")
    b = calibration_bins(check.values, check.returns)
    if b:
        ax.plot([x[0] for x in b], [x[1] for x in b], "o-", color="C0", label="binned mean")
    lo = min(check.values + check.returns + [0.0])
    hi = max(check.values + check.returns + [0.0])
    ax.plot([lo, hi], [lo, hi], "--", color="black", lw=0.8, label="perfect")
    ax.set_xlabel("V(s_t)")
    ax.set_ylabel("realised discounted return G_t")
    ax.set_title("Critic calibration")
    ax.legend(fontsize=7)
    return to_png(fig)


# ---- the report ------------------------------------------------------------------------------------
@dataclass
class DiagnoseResult:
    """What ``polyturn diagnose`` found, and where it wrote it."""

    warnings: list[C.TrainingWarning]
    critic: CriticCheck | None
    paths: dict[str, Path]
    iterations: int = 0  #: RL iterations read from metrics.jsonl
    held_out: list[HeldOutComparison] = field(default_factory=list)


def _f(v: float | None) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"


def diagnose_blocks(run: Path, records: Sequence[dict[str, Any]], *, warnings: Sequence[C.TrainingWarning],
                    critic: CriticCheck | None, note: str | None,
                    held_out: Sequence[HeldOutComparison] = (), pairs: dict[str, float] | None = None) -> list[Block]:
    """The layout of ``diagnose.md``."""
    rl = C.rl_records(records)
    b: list[Block] = [Heading(f"polyturn diagnose: {run}", 1),
                      Para(f"{len(rl)} RL iterations in metrics.jsonl. Each check, its threshold and its remedy: "
                           "docs/evaluation.md.")]
    b.append(Heading("Warnings"))
    if not warnings:
        b.append(Para("No warning fired."))
    for w in warnings:
        b.append(Heading(f"{w.kind}: {w.metric}" + (f" ({w.where})" if w.where else ""), 3))
        plot = f"plot: [{w.plot}](./{w.plot})" if w.plot.endswith(".png") else "see the critic check below"
        b.append(Bullets((w.message, plot, f"remedy: {w.remedy}")))
    terms = sorted({k for r in rl for k in r if k.startswith("reward/")})
    if rl:
        b.append(Heading("Return and reward terms"))
        b.append(Para(f"Per iteration; red dots are spikes (a jump of more than {C.SPIKE_Z:g} robust SDs of the "
                      f"series' changes and at least {C.SPIKE_MIN_SHARE:.0%} of the outcome scale)."))
        b.append(Image("rewards", "Figure: return and reward terms per update.",
                       curves_png(records, ["charts/return_mean", *terms], title="Rewards", mark_spikes=True)))
        b.append(Heading("Training diagnostics"))
        present = [k for k in CURVES if len(C.series(records, k)[0])]
        b.append(Image("training", "Figure: success rate, value loss, explained variance, approx_kl, clipfrac, "
                       "entropy and the diversity of the episodes per iteration.",
                       curves_png(records, present, title="Training", mark_spikes=False)))
        last = rl[-1]
        b.append(Table(("metric", "last update"), tuple((k, _f(C._num(last.get(k)))) for k in ("charts/return_mean", *CURVES)
                                                          if k in last)))
    limits = summarize_constraints(records)
    if limits:  # a constrained run: its costs, limits and multipliers
        b.extend(constraint_blocks(records))
        b.append(Image("constraints", "Figure: each constrained term's cost per episode and multiplier per update.",
                       curves_png(records, curve_keys(limits), title="Constraints", mark_spikes=False)))
    if pairs:
        counted = ", ".join(f"{pairs[n]:.0f} {n.removeprefix('critic/').replace('_', ' ')}"
                            for n in dict.fromkeys(PAIR_ACC.values()) if n in pairs)
        b.append(Heading("Action critic: held-out pairwise accuracy"))
        b.append(Para(f"How often the critic ranked the better of two attempts at a task above the worse one "
                      f"({counted} in all), each iteration's pairs scored before the critic trained on them: by "
                      "episode score; by turn score at the first turn where the two attempts differ; and, with "
                      "branches (critic.branch_states), by turn score on attempts that replayed one state and "
                      "differ from its turn on. 0.5 is chance."))
        b.append(Table(("accuracy", "whole run (pair-weighted)", "last iteration"), tuple(
            (k, _f(pairs.get(k)), _f(pairs.get(f"{k}/last"))) for k in PAIR_ACC if k in pairs)))
    b.extend(held_out_blocks(held_out))
    spent, machine = _timing(run)
    if spent:
        b.append(Heading("Wall time per phase"))
        b.append(Para("From summary.json (the trainer's clock; a resumed run counts the phases' time before the kill "
                      "up to its last checkpoint)" + (f", measured on {describe_machine(machine)}." if machine else ".")))
        b.append(Table(("phase", "minutes"), tuple((k, f"{v / 60:.1f}") for k, v in spent.items())))
    b.append(Heading("Critic check"))
    if critic is None:
        b.append(Para(note or "Skipped."))
        return b
    b.append(Para(f"Checkpoint {critic.checkpoint}: {critic.episodes} held-out episodes, gamma {critic.gamma:g}. "
                  f"MSE(V, G) = {_f(critic.mse)}; explained variance = {critic.explained_variance_text()}."))
    b.append(Image("calibration", "Figure: V(s_t) against realised discounted return, binned by V.", calibration_png(critic)))
    for title, rows in critic.tables:
        b.append(Heading(f"V_target vs V(S): {title}", 3))
        b.append(Table(("turn", "action", "reward", "G_t (return-to-go)", "TD target", "V(s_t)"), tuple(
            (str(r["turn"]), r["action_type"], _f(r["reward"]), _f(r["G"]), _f(r["td_target"]), _f(r["V"]))
            for r in rows)))
    degenerate = [a for a in critic.actions if C.is_degenerate(a)]
    if degenerate:
        b.append(Para(f"Degenerate actions among the validation turns: {len(degenerate)} of {len(critic.actions)}."))
        b.append(Code(degenerate[0][:300]))
    return b


def run_metrics(run: Path) -> Path:
    """``run``'s metrics.jsonl; a clear error when ``run`` is not a training run's directory."""
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"Expected a run directory with metrics.jsonl (from polyturn train), got {run}")
    return metrics


def diagnose(
    run_dir: str | Path,
    *,
    checkpoint: str | None = None,
    episodes: int = 16,
    out_dir: str | Path | None = None,
    progress: Callable[[int], None] | None = None,
    seed: int = 0,
    critic_values: CriticValues | None = None,
) -> DiagnoseResult:
    """Diagnose a training run (see the module docstring); ``episodes=0`` skips the critic check.

    Works on a run that is still training: it reads the records written so far. ``critic_values`` computes
    a checkpoint critic's values (:data:`CriticValues`); without it the critic check is skipped.
    """
    run = Path(run_dir)
    metrics = run_metrics(run)
    if episodes < 0:
        raise ValueError(f"Expected --episodes >= 0, got {episodes}")
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"Expected --out to be a directory, got the file {out_dir}")
    records = read_records(metrics)
    critic, note = None, None
    if episodes == 0:
        note = "Skipped (--episodes 0)."
    else:
        ckpt = pick_checkpoint(run, checkpoint)
        if ckpt is None:
            note = f"Skipped: no checkpoint (ckpt-*/actor) in {run}."
        elif critic_values is None:
            note = "Skipped: no critic_values function given (the polyturn command gives the trainer's)."
        else:
            critic = critic_check(ckpt, episodes=episodes, critic_values=critic_values, progress=progress, seed=seed)
            if critic is None:
                note = (f"Skipped: {ckpt.name} was trained with a critic that has no state values to check "
                        "(critic.kind none, or action: see its pairwise accuracy above).")
    warnings = C.check_all(records, actions=critic.actions if critic else (),
                           updates_per_iter=_updates_per_iter(run))
    out = Path(out_dir) if out_dir is not None else run / "diagnose"
    out.mkdir(parents=True, exist_ok=True)
    held_out = held_out_comparisons(run)
    pairs = pair_accuracy_summary(records)
    blocks = diagnose_blocks(run, records, warnings=warnings, critic=critic, note=note, held_out=held_out,
                             pairs=pairs)
    (out / "diagnose.md").write_text(to_markdown(blocks, image_dir="."), encoding="utf-8")
    write_images(blocks, out)
    summary = {
        "warnings": [{"kind": w.kind, "metric": w.metric, "message": w.message, "start_iter": w.start_iter,
                      "end_iter": w.end_iter, "evidence": w.evidence, "plot": str(out / w.plot), "remedy": w.remedy}
                     for w in warnings],
        "critic": None if critic is None else {"checkpoint": critic.checkpoint, "episodes": critic.episodes,
                                               "gamma": critic.gamma, "mse": critic.mse,
                                               "explained_variance": critic.explained_variance,
                                               "explained_variance_text": critic.explained_variance_text(),
                                               "returns_var": critic.returns_var if critic.returns else None,
                                               "episode_tables": [{"episode": t, "turns": r} for t, r in critic.tables]},
        "pair_accuracy": pairs,
        "held_out": [{"before": c.before, "after": c.after, "episodes": c.episodes,
                      "metrics": {k: {c.before: v0, c.after: v1} for k, (v0, v1) in c.metrics.items()},
                      "gained": c.gained, "lost": c.lost, "sign_test_p": c.p_value,
                      "by_level": [{"level": lv, "tasks": n, c.before: s0, c.after: s1} for lv, n, s0, s1 in c.by_level],
                      "env_metrics": {k: {c.before: v0, c.after: v1} for k, (v0, v1) in c.env_metrics.items()},
                      "by_group": {name: [{name: g, "tasks": n, c.before: s0, c.after: s1} for g, n, s0, s1 in by]
                                   for name, by in c.groups.items()}}
                     for c in held_out],
        "constraints": [dataclasses.asdict(c) for c in summarize_constraints(records)],
    }
    (out / "diagnose.json").write_text(json.dumps(summary, indent=2, default=float), encoding="utf-8")
    return DiagnoseResult(warnings, critic, {"markdown": out / "diagnose.md", "json": out / "diagnose.json",
                                             "dir": out}, iterations=len(C.rl_records(records)), held_out=held_out)


def _timing(run: Path) -> tuple[dict[str, float], dict | None]:
    """``summary.json``'s ``phase_s`` (wall seconds per phase) and ``machine`` (what they were measured on);
    empty and None when the run has none (still training, or written before polyturn kept them)."""
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        spent, machine = summary.get("phase_s") or {}, summary.get("machine")
    except (OSError, ValueError, AttributeError):
        return {}, None
    return ({str(k): float(v) for k, v in spent.items() if isinstance(v, (int, float))},
            machine if isinstance(machine, dict) else None)


def _updates_per_iter(run: Path) -> int | None:
    """Actor updates per iteration from the run's ``config.yaml`` (None when absent or not loadable)."""
    try:
        return C.updates_per_iter(load_config(run / "config.yaml")) if (run / "config.yaml").is_file() else None
    except ConfigError:
        return None
