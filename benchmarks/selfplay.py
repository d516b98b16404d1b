"""Self-play against scripted-partner training on a multi-role game: every final policy in every seat against the
training partners and the evaluation-only ones, and each run's critic's explained variance.

The comparison of docs/selfplay.md (one shared BC; the variants' runs made by the command there)::

    python benchmarks/selfplay.py --root runs/sp --variants scripted sp_central sp_local sp_none \\
        --seeds 0 1 2 3 4 --bc runs/negotiation_bc/ckpt-bc --episodes 100 --json runs/sp/selfplay.json

``--ev-episodes N`` also scores the same N self-play games (seed k's ``sp_central`` policy in both seats, sampled at
T = 1 on held-out tasks) with seed k's centralized and local critics: explained variance of each against the
realised returns, on the very same turns.

``--run DIR`` (repeatable) evaluates given runs instead. Per variant: the mean over seeds, +- the seeds' standard
deviation, of each seat's success and mean return (the seat's own utility: 0-10) against the training partners
(conceding, fair, tough) and the evaluation-only ones (tit-for-tat, random concessions), and the critic's explained
variance over the last 10 RL iterations (``-`` for a critic-free run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from polyturn.acting.checkpoint import load_checkpoint
from polyturn.acting.seats import training_partners
from polyturn.eval.tournament import Arena, against_partners, holdout_partners
from polyturn.train.logger import read_metrics

MULTI = {"opponent": "self"}


def critic_ev(run: Path) -> float | None:
    """Mean logged explained variance of the last 10 RL iterations (None: the run logs none)."""
    vals = [r["losses/explained_variance"] for r in read_metrics(run / "metrics.jsonl")
            if r.get("phase") in ("warmup", "mixed", "ppo") and isinstance(r.get("losses/explained_variance"), float)]
    vals = [v for v in vals if v == v]  # NaN: ill-conditioned batches
    return statistics.fmean(vals[-10:]) if vals else None


def evaluate(ckpt_dir: Path, *, episodes: int) -> dict:
    """The checkpoint's figures by partner group (training / evaluation-only) and seat."""
    ckpt = load_checkpoint(ckpt_dir)
    cfg = ckpt.config
    arena = Arena(env_id=cfg.env.id, env_kwargs={**cfg.env.kwargs, **MULTI}, seed_start=cfg.env.eval_seed_start)
    out = {}
    for group, partners in (("training", training_partners(cfg.env.id)), ("holdout", holdout_partners(cfg.env.id))):
        table = against_partners(ckpt, arena, partners, episodes=episodes)
        for role in arena.roles:
            cells = [table[p][role] for p in table]
            out[f"{group}/{role}/success"] = statistics.fmean(c["success_rate"] for c in cells)
            out[f"{group}/{role}/return"] = statistics.fmean(c["return_mean"] for c in cells)
            out[f"{group}/{role}/joint_efficiency"] = statistics.fmean(c.get("joint_efficiency", 0.0) for c in cells)
        out[f"{group}/both/return"] = statistics.fmean(out[f"{group}/{r}/return"] for r in arena.roles)
        out[f"{group}/both/success"] = statistics.fmean(out[f"{group}/{r}/success"] for r in arena.roles)
    return out


def same_episode_ev(actor_run: Path, critic_runs: dict[str, Path], *, episodes: int) -> dict[str, float]:
    """Each critic's explained variance on the same self-play games of ``actor_run``'s final policy (both seats)."""
    import torch

    from polyturn.algos.gae import turn_gae
    from polyturn.algos.value import explained_variance
    from polyturn.models.critic import SeparateCritic
    from polyturn.rollout.multi import Seat
    from polyturn.train.critics import SeparateLearner, turn_tensors

    ckpt = load_checkpoint(actor_run / "ckpt-final")
    cfg = ckpt.config
    arena = Arena(env_id=cfg.env.id, env_kwargs=cfg.env.kwargs, seed_start=cfg.env.eval_seed_start)
    games = [{"seed": arena.seed_start + k, "seats": {r: Seat("p", actor=ckpt.actor) for r in arena.roles}}
             for k in range(episodes)]
    eps = [ep for g in arena.play(games, ckpt.settings, temperature=1.0, seed=0) for ep in g.values() if ep.turns]
    tt = turn_tensors(eps)
    rewards = tt["rewards"] * cfg.ppo.reward_scale
    gamma = cfg.curriculum.gamma.end
    out = {}
    for name, run in critic_runs.items():
        learner = SeparateLearner(SeparateCritic.from_pretrained(run / "ckpt-final" / "critic"), cfg.critic)
        values, next_values = learner.values(eps)
        _, returns = turn_gae(rewards, values, next_values, tt["terminated"], tt["mask"], gamma=gamma, lam=1.0)
        out[name] = float(explained_variance(values, returns, tt["mask"]))
    out["turns"] = float(tt["mask"].sum())
    return out


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


COLUMNS = ("holdout/both/return", "holdout/first/return", "holdout/second/return", "holdout/both/success",
           "training/both/return", "training/first/return", "training/second/return", "training/both/success",
           "holdout/both/joint_eff", "ev")


def table(rows: dict[str, list[dict]]) -> str:
    head = ["variant", "seeds", "utility vs eval-only (both seats)", "first", "second", "success vs eval-only",
            "utility vs training partners", "first", "second", "success vs training", "critic EV (last 10)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, runs in rows.items():
        cells = [fmt([r[c] for r in runs if r.get(c) is not None]) for c in COLUMNS if c != "holdout/both/joint_eff"]
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=None, help="holds <variant>/seed<k>/ run directories")
    p.add_argument("--variants", nargs="*", default=[])
    p.add_argument("--seeds", nargs="*", type=int, default=[0])
    p.add_argument("--run", action="append", type=Path, default=[], help="a run directory (repeatable)")
    p.add_argument("--bc", type=Path, default=None, help="the shared BC checkpoint (a row of its own)")
    p.add_argument("--episodes", type=int, default=100, help="held-out tasks per partner and seat")
    p.add_argument("--ev-episodes", type=int, default=0, help="self-play games scored by both critics of a seed")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="2 tasks per partner and seat (a smoke test)")
    args = p.parse_args(argv)
    episodes = 2 if args.quick else args.episodes
    runs: dict[str, list[Path]] = {f"run {d.name}": [d] for d in args.run}
    for v in args.variants:
        runs[v] = [args.root / v / f"seed{s}" for s in args.seeds if (args.root / v / f"seed{s}" / "ckpt-final").is_dir()]
    rows: dict[str, list[dict]] = {}
    if args.bc is not None:
        rows["BC (start)"] = [evaluate(args.bc, episodes=episodes)]
    for name, dirs in runs.items():
        rows[name] = []
        for d in dirs:
            figs = evaluate(d / "ckpt-final", episodes=episodes)
            figs["ev"] = critic_ev(d)
            figs["run"] = str(d)
            rows[name].append(figs)
            print(f"{d}: {json.dumps({k: round(v, 3) for k, v in figs.items() if isinstance(v, float)})}",
                  file=sys.stderr)
    print(table(rows))
    if args.ev_episodes and args.root is not None:
        evs = {"central": [], "local": []}
        for seed in args.seeds:
            runs_k = {"central": args.root / "sp_central" / f"seed{seed}", "local": args.root / "sp_local" / f"seed{seed}"}
            if all((r / "ckpt-final").is_dir() for r in runs_k.values()):
                got = same_episode_ev(runs_k["central"], runs_k, episodes=2 if args.quick else args.ev_episodes)
                print(f"seed {seed}: {json.dumps({k: round(v, 3) for k, v in got.items()})}", file=sys.stderr)
                for k in evs:
                    evs[k].append(got[k])
        rows["same-episode EV"] = [{"central": c, "local": lo} for c, lo in zip(evs["central"], evs["local"])]
        print(f"\nexplained variance on the same self-play games (the centralized run's policy): centralized "
              f"{fmt(evs['central'])}, local {fmt(evs['local'])} ({len(evs['central'])} seeds)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
