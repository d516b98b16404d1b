"""Evaluating policies of a multi-role game in a way training cannot game.

* **Partners**: a checkpoint in every seat against each scripted partner, those training may sample (the env
  spec's ``partners``) and those only evaluation loads (its ``holdout_partners``: strategies no training path can
  reach, so a policy that overfitted its training partners shows it here).
* **Head to head**: checkpoints against each other (e.g. a self-play run's opponent pool and its final policy), in
  both seats on the same tasks; a game is won by the side whose own return is higher (a tie counts half).

Per cell: games, success rate (the seat's own success), mean return, and, where the env reports a deal summary at
the end of a game (``info["deal"]``, Negotiation-v0), the deal rate, the mean share of the best joint worth reached
(``joint / max_joint``, 0 without a deal: Pareto efficiency), the share of Pareto-optimal outcomes and the mean
fairness of the deals made.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from polyturn.acting.checkpoint import LoadedCheckpoint  # noqa: E402
from polyturn.acting.registry import make_env, spec_or_none  # noqa: E402
from polyturn.acting.seats import training_partners  # noqa: E402
from polyturn.envs.multi_agent import is_multi_agent  # noqa: E402
from polyturn.envs.spec import load_attr  # noqa: E402
from polyturn.rollout.multi import MultiAgentCollector, Player, Seat  # noqa: E402
from polyturn.rollout.types import Episode  # noqa: E402


def holdout_partners(env_id: str) -> dict[str, Callable[[], Player]]:
    """The env's evaluation-only scripted partners by name (its spec's ``holdout_partners``; empty: none)."""
    spec = spec_or_none(env_id)
    ref = getattr(spec, "holdout_partners", None) if spec is not None else None
    return dict(load_attr(ref)) if ref else {}


def figures(episodes: Sequence[Episode]) -> dict[str, float]:
    """One seat's figures over its games (see the module docstring)."""
    n = len(episodes)
    out: dict[str, float] = {"games": float(n)}
    if not n:
        return out
    out["success_rate"] = sum(ep.success for ep in episodes) / n
    out["return_mean"] = sum(ep.episode_return for ep in episodes) / n
    deals = [ep.turns[-1].info.get("deal") if ep.turns else None for ep in episodes]
    if any(d is not None for d in deals):
        made = [d for d in deals if d and d.get("deal")]
        out["deal_rate"] = len(made) / n
        out["joint_efficiency"] = sum(d["joint"] / d["max_joint"] for d in made if d.get("max_joint")) / n
        out["pareto_rate"] = sum(bool(d.get("pareto_optimal")) for d in made) / n
        fair = [d["fairness"] for d in made if d.get("fairness") is not None]
        if fair:
            out["fairness"] = sum(fair) / len(fair)
    return out


@dataclass
class Arena:
    """Where games are played: ``num_envs`` multi-role environments of ``env_id`` (``env_kwargs``) and the held-out
    task seeds from ``seed_start``."""

    env_id: str
    env_kwargs: Mapping[str, Any]
    seed_start: int
    num_envs: int = 32

    def __post_init__(self) -> None:
        env = make_env(self.env_id, self.env_kwargs)
        if not is_multi_agent(env):
            raise ValueError(f"Expected the multi-role form of {self.env_id}, got a single-agent env with kwargs "
                             f"{dict(self.env_kwargs)}: pass the kwargs that make it multi-role (e.g. --env-kwargs "
                             "'{\"opponent\": \"self\"}' for Negotiation-v0)")
        self.roles = tuple(env.unwrapped.roles)
        env.close()

    def collector(self, settings: Any, n: int) -> MultiAgentCollector:
        envs = [make_env(self.env_id, self.env_kwargs) for _ in range(max(1, min(self.num_envs, n)))]
        return MultiAgentCollector(envs, env_id=self.env_id, settings=settings)

    def play(self, games: list[dict], settings: Any, *, temperature: float, seed: int,
             progress: Callable[[int], None] | None = None) -> list[dict[str, Episode]]:
        actor = next(s.actor for g in games for s in g["seats"].values() if s.actor is not None)
        generator = torch.Generator(device=actor.device).manual_seed(seed)
        col = self.collector(settings, len(games))
        try:
            return col.collect(games, temperature=temperature, generator=generator, progress=progress)
        finally:
            for e in col.envs:
                e.close()


def against_partners(ckpt: LoadedCheckpoint, arena: Arena, partners: Mapping[str, Callable[[], Player]], *,
                     episodes: int, temperature: float = 0.0, seed: int = 0,
                     progress: Callable[[int], None] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """``ckpt`` in each seat against each partner on ``episodes`` held-out tasks: partner -> role -> figures."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in sorted(partners):
        games, where = [], []
        for role in arena.roles:
            for k in range(episodes):
                seats = {r: Seat(ckpt.label, actor=ckpt.actor) if r == role else Seat(f"scripted:{name}",
                                                                                     player=partners[name])
                         for r in arena.roles}
                games.append({"seed": arena.seed_start + k, "seats": seats})
                where.append(role)
        played = arena.play(games, ckpt.settings, temperature=temperature, seed=seed, progress=progress)
        out[name] = {role: figures([g[r] for g, r in zip(played, where) if r == role]) for role in arena.roles}
    return out


def head_to_head(ckpts: Sequence[LoadedCheckpoint], arena: Arena, *, episodes: int, temperature: float = 0.0,
                 seed: int = 0, progress: Callable[[int], None] | None = None) -> list[list[float | None]]:
    """``[i][j]``: how often checkpoint ``i`` out-earns checkpoint ``j`` (ties half) over ``episodes`` tasks with
    ``i`` in each seat in turn; ``None`` on the diagonal."""
    n = len(ckpts)
    wins = [[None if i == j else 0.0 for j in range(n)] for i in range(n)]
    settings = ckpts[0].settings
    for i in range(n):
        for j in range(i + 1, n):
            games, order = [], []
            for role in arena.roles:  # i in ``role``, j in every other seat
                for k in range(episodes):
                    seats = {r: Seat(f"{i}", actor=ckpts[i].actor) if r == role else Seat(f"{j}", actor=ckpts[j].actor)
                             for r in arena.roles}
                    games.append({"seed": arena.seed_start + k, "seats": seats})
                    order.append(role)
            played = arena.play(games, settings, temperature=temperature, seed=seed, progress=progress)
            score = []
            for g, role in zip(played, order):
                mine = g[role].episode_return
                theirs = max(ep.episode_return for r, ep in g.items() if r != role)
                score.append(1.0 if mine > theirs else 0.5 if mine == theirs else 0.0)
            wins[i][j] = float(np.mean(score))
            wins[j][i] = 1.0 - wins[i][j]
    return wins


def plot_matrix(labels: Sequence[str], wins: Sequence[Sequence[float | None]]) -> plt.Figure:
    """The head-to-head matrix as a heat map (row's win rate against column)."""
    n = len(labels)
    grid = np.array([[np.nan if v is None else v for v in row] for row in wins], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * n, 1.0 + 0.6 * n))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdBu")
    ax.set_xticks(range(n), labels, rotation=45, ha="right")
    ax.set_yticks(range(n), labels)
    for i in range(n):
        for j in range(n):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title("win rate of row against column")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def markdown(partner_rows: Mapping[str, Mapping[str, Mapping[str, Mapping[str, float]]]],
             holdout: set[str], labels: Sequence[str], wins: Sequence[Sequence[float | None]]) -> str:
    """The report: a table per checkpoint (partner x seat) and the head-to-head matrix."""
    lines = ["# Tournament", ""]
    for label, table in partner_rows.items():
        lines += [f"## {label} against scripted partners", "",
                  "| partner | seat | games | success | mean return | deal rate | joint efficiency | Pareto | fairness |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for partner, by_role in table.items():
            tag = f"{partner} (evaluation only)" if partner in holdout else partner
            for role, f in by_role.items():
                cells = [f"{f[k]:.3f}" if k in f else "-" for k in ("success_rate", "return_mean", "deal_rate",
                                                                       "joint_efficiency", "pareto_rate", "fairness")]
                lines.append(f"| {tag} | {role} | {int(f['games'])} | " + " | ".join(cells) + " |")
        lines.append("")
    if len(labels) > 1:
        lines += ["## Head to head (row's win rate against column)", "", "| | " + " | ".join(labels) + " |",
                  "|---" * (len(labels) + 1) + "|"]
        for label, row in zip(labels, wins):
            lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in row) + " |")
    return "\n".join(lines) + "\n"


def write(out: Path, partner_rows: dict, holdout: set[str], labels: list[str], wins: list) -> dict[str, Path]:
    """``tournament.json``, ``tournament.md`` and (with two checkpoints or more) ``head_to_head.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "tournament.json", "markdown": out / "tournament.md"}
    paths["json"].write_text(json.dumps({"partners": partner_rows, "holdout": sorted(holdout), "labels": labels,
                                         "head_to_head": wins}, indent=2))
    paths["markdown"].write_text(markdown(partner_rows, holdout, labels, wins))
    if len(labels) > 1:
        paths["png"] = out / "head_to_head.png"
        fig = plot_matrix(labels, wins)
        fig.savefig(paths["png"], dpi=90)
        plt.close(fig)
    return paths


def all_partners(env_id: str) -> tuple[dict[str, Callable[[], Player]], set[str]]:
    """Training and evaluation-only partners together (a name in both is the training one), and the latter's
    names."""
    held = holdout_partners(env_id)
    return {**held, **training_partners(env_id)}, set(held)
