"""Critic ablation: which critic helps RL improve on the same BC policy, and how fast?

Runs RL from one BC checkpoint with each critic variant, for the same number of
sampled episodes each (``ppo.episodes_per_iter`` x iterations; the group
variants play ``critic.group_size`` episodes per task within that budget),
over several seeds, and prints held-out success (mean and spread over seeds),
the learning curve's area and wall time. The variants of issue 29:

* ``separate+priv`` / ``separate`` — the separate value critic with / without the privileged text (GAE at the
  config's lambda, 1.0 in the tiny configs: the critic is a per-turn baseline);
* ``separate+priv@0.9`` / ``separate@0.9`` — the same at lambda 0.9, where per-turn credit comes from the critic;
* ``action+priv`` / ``action`` — the action-level critic (Bradley-Terry on pairs of attempts at a task) with /
  without the privileged text, used by ``--action-algo`` (critic_pg by default);
* ``action+priv+redist`` / ``action+redist`` — the same critics with ``critic.credit: redistribute``: the
  episode's RLOO advantage, spread over its turns by the critic's scores (not in the default set);
* ``action+priv+redist+branch`` / ``action+redist+branch`` — the same, also trained on turn-level labels from
  branches: 3 more continuations from each of 16 states an iteration (``critic.branch_states``; not in the default
  set, and the branches' episodes are sampled on top of the iteration's own);
* ``none``                     — no critic, group-relative (RLOO) baseline over 4 episodes per task;
* ``shared``                   — a value head on the actor (not in the default set);
* ``config``                   — the config's own critic and update, e.g. rft + BC in ``configs/sql_smollm2.yaml``
  (not in the default set; the baseline the SmolLM2 comparison of issue 29 measures against).

The learning curve: held-out success (greedy) at BC, every ``--curve-every`` iterations (``run.eval_every``) and at
the end; its area is the mean of the curve over the iterations (trapezoids), so a variant that gets there sooner
scores higher. Run by hand (it trains len(variants) x len(seeds) policies; one core each)::

    .venv/bin/python benchmarks/ablation.py --config configs/negotiation_tiny.yaml --out runs/ablation_negotiation \\
        --iters 60 --seeds 0 1 2 3 4 --curve-every 10 --set run.train_threads=1
    .venv/bin/python benchmarks/ablation.py --config configs/sql_tiny.yaml --out runs/ablation_sql \\
        --iters 90 --seeds 0 1 2 --curve-every 10 --set run.train_threads=1

``--quick`` runs two variants for two iterations on a tiny model (a smoke test; the figures mean nothing).
The BC phase runs once (or pass ``--bc-run DIR`` holding ``ckpt-bc`` and ``demos.jsonl`` from an earlier run);
every variant then starts from that actor (``actor.init_from``) with a fresh critic.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from polyturn.acting.jsonl import read_jsonl
from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.eval.diagnose import PAIR_ACC, pair_accuracy_summary
from polyturn.health.signals import read_records
from polyturn.train.trainer import Trainer

VARIANTS = {
    "separate+priv": ["critic.kind=separate", "critic.privileged=true"],
    "separate": ["critic.kind=separate", "critic.privileged=false"],
    "separate+priv@0.9": ["critic.kind=separate", "critic.privileged=true", "ppo.lam=0.9"],
    "separate@0.9": ["critic.kind=separate", "critic.privileged=false", "ppo.lam=0.9"],
    "action+priv": ["critic.kind=action", "critic.privileged=true", "critic.group_size=4"],
    "action": ["critic.kind=action", "critic.privileged=false", "critic.group_size=4"],
    "action+priv+redist": ["critic.kind=action", "critic.privileged=true", "critic.group_size=4",
                           "critic.credit=redistribute"],
    "action+redist": ["critic.kind=action", "critic.privileged=false", "critic.group_size=4",
                      "critic.credit=redistribute"],
    "action+priv+redist+branch": ["critic.kind=action", "critic.privileged=true", "critic.group_size=4",
                                  "critic.credit=redistribute", "critic.branch_states=16", "critic.branch_candidates=3"],
    "action+redist+branch": ["critic.kind=action", "critic.privileged=false", "critic.group_size=4",
                             "critic.credit=redistribute", "critic.branch_states=16", "critic.branch_candidates=3"],
    "none": ["critic.kind=none", "critic.group_size=4"],
    "shared": ["critic.kind=shared"],
    "config": [],
}
DEFAULT = [v for v in VARIANTS if v not in ("shared", "config") and not v.endswith(("+redist", "+branch"))]
#: --quick: a tiny actor and critic, few demonstrations and episodes (a smoke test of the script).
QUICK = ["actor.hidden=32", "actor.layers=1", "actor.vocab_size=1024", "critic.hidden=32", "critic.layers=1",
         "critic.max_len=128", "bc.episodes=24", "bc.epochs=1", "bc.batch_episodes=8", "bc.warmup_steps=1",
         "ppo.episodes_per_iter=8", "ppo.minibatch_episodes=8", "ppo.epochs=1", "rollout.num_envs=8",
         "run.train_threads=1", "run.tensorboard=false", "rollout.eval_sampled_temperature=null"]


def _spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def bc_start(bc_run: Path) -> dict | None:
    """The shared BC policy's held-out greedy evaluation: its run's summary, else its episodes (success only)."""
    summary, episodes = bc_run / "summary.json", bc_run / "eval_bc.jsonl"
    if summary.is_file():
        return json.loads(summary.read_text())["eval"].get("bc")
    if episodes.is_file():
        records = read_jsonl(episodes)
        return {"success_rate": sum(r["success"] for r in records) / len(records)} if records else None
    return None


def variant_overrides(name: str, action_algo: str) -> list[str]:
    """A variant's config overrides, with ``--action-algo`` for the action-critic variants."""
    return VARIANTS[name] + ([f"ppo.algo={action_algo}"] if name.startswith("action") else [])


def with_start(evals: dict, bc: dict | None) -> dict:
    """A run's evaluations with the shared BC policy's as its ``bc`` (a run that evaluated its start keeps its own)."""
    return {"bc": bc, **evals} if bc is not None else evals


def curve(evals: dict, iters: int) -> list[tuple[int, float]]:
    """``(iteration, held-out greedy success)``: BC at 0, every ``iterNNNN`` evaluation, final at ``iters``."""
    pts = [(0, evals["bc"]["success_rate"])] if "bc" in evals else []
    pts += sorted((int(k[4:]), v["success_rate"]) for k, v in evals.items() if k.startswith("iter"))
    if "final" in evals:
        pts.append((iters, evals["final"]["success_rate"]))
    return pts


def curve_area(points: list[tuple[int, float]]) -> float:
    """The curve's mean height over its iterations (trapezoids); a single point is its own height."""
    if len(points) < 2:
        return points[0][1] if points else float("nan")
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/sql_tiny.yaml")
    p.add_argument("--out", default="runs/ablation")
    p.add_argument("--bc-run", default=None, help="run dir with ckpt-bc/ and demos.jsonl (skips the BC phase)")
    p.add_argument("--iters", type=int, default=30, help="RL iterations per variant (warm-up and mixed included)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-episodes", type=int, default=200)
    p.add_argument("--curve-every", type=int, default=None, help="held-out evaluation every N iterations")
    p.add_argument("--variants", nargs="+", default=DEFAULT, choices=list(VARIANTS))
    p.add_argument("--action-algo", default="critic_pg", choices=["turn_dpo", "critic_pg", "critic_rft", "ppo"],
                   help="the policy update of the action-critic variants")
    p.add_argument("--quick", action="store_true", help="tiny model, 2 iterations, 1 seed, 2 variants (smoke test)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run (repeatable, applied last: it wins over the schedule and "
                        "the variant), e.g. run.train_threads=1")
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.seeds, args.eval_episodes, args.curve_every = 2, args.seeds[:1], 4, 1
        args.variants = args.variants if args.variants != DEFAULT else ["action+priv", "none"]
        args.overrides = [*QUICK, *args.overrides]
    _quiet_libraries()
    out = Path(args.out)
    warm, mixed = (0, 1) if args.quick else (max(1, args.iters // 10), max(1, args.iters // 5))
    schedule = [f"curriculum.warmup_iters={warm}", f"curriculum.mixed_iters={mixed}",
                f"curriculum.ppo_iters={args.iters - warm - mixed}", f"env.eval_episodes={args.eval_episodes}",
                "run.checkpoint_every=1000", *args.overrides]
    if args.curve_every:
        schedule.append(f"run.eval_every={args.curve_every}")

    bc_run = Path(args.bc_run) if args.bc_run else out / "bc"
    if not (bc_run / "ckpt-bc").is_dir():
        if args.bc_run:  # a user's run directory is never trained over
            raise SystemExit(f"--bc-run {bc_run}: expected a run directory holding ckpt-bc/ and demos.jsonl")
        print(f"BC phase -> {bc_run}", flush=True)
        cfg = load_config(args.config, [f"run.out_dir={bc_run}", *args.overrides, "curriculum.warmup_iters=0",
                                        "curriculum.mixed_iters=0", "curriculum.ppo_iters=0",
                                        f"env.eval_episodes={args.eval_episodes}"])
        Trainer(cfg, overwrite=True).run()  # a BC phase cut short starts again

    start = bc_start(bc_run)  # evaluated once: every variant starts from the same greedy policy
    for name in args.variants:
        extra = variant_overrides(name, args.action_algo) + (["run.eval_start=false"] if start is not None else [])
        for seed in args.seeds:
            run_dir = out / name / f"seed{seed}"
            if (run_dir / "summary.json").is_file():
                continue  # finished earlier: runs accumulate, so variants can be run (or resumed) separately
            # --set comes last: the user's overrides win over the schedule's and the variant's.
            overrides = [f"run.out_dir={run_dir}", f"run.seed={seed}", f"actor.init_from={bc_run / 'ckpt-bc'}",
                         f"bc.demos={bc_run / 'demos.jsonl'}", *schedule, *extra, *args.overrides]
            torch.manual_seed(seed)
            summary = Trainer(load_config(args.config, overrides), overwrite=True).run()  # an unfinished run restarts
            ev = with_start(summary["eval"], start)
            print(f"{name} seed {seed}: greedy {ev['final']['success_rate']:.3f}, curve area "
                  f"{curve_area(curve(ev, args.iters)):.3f}, {summary['wall_s'] / 60:.1f} min", flush=True)
    # The sampled-episode budget, as a run of the first variant saw it (--set may only be valid with a variant's
    # settings, e.g. critic.branch_states with critic.kind action).
    cfg = load_config(args.config, [*variant_overrides(args.variants[0], args.action_algo), *args.overrides])
    print_table(out, iters=args.iters, seeds=args.seeds, eval_episodes=args.eval_episodes,
                episodes_per_iter=cfg.ppo.episodes_per_iter, bc=start)


def print_table(out: Path, *, iters: int, seeds: list[int], eval_episodes: int,
                episodes_per_iter: int, bc: dict | None = None) -> None:
    """The ablation table from every finished run's summary.json under ``out`` (every variant that has one);
    ``bc``: the shared BC policy's evaluation, for runs that did not evaluate their start."""
    print(f"\nCritic ablation: {iters} RL iterations ({iters * episodes_per_iter} sampled episodes) per run "
          f"from one BC policy, seeds {seeds}, {eval_episodes} held-out tasks; mean ± stdev over seeds")
    print("| critic | BC start, greedy | final, greedy | curve area, greedy | final mean return, greedy "
          "| final invalid actions, greedy | held-out pair accuracy: whole / first differing turn / branches "
          "(action critics) | wall time per run (min) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in VARIANTS:
        evs, walls, areas = [], [], []
        accs: dict[str, list[float]] = {}
        for path in sorted((out / name).glob("seed*/summary.json")):
            summary = json.loads(path.read_text())
            ev = with_start(summary["eval"], bc)
            evs.append(ev)
            walls.append(summary["wall_s"] / 60)
            areas.append(curve_area(curve(ev, iters)))
            metrics = path.parent / "metrics.jsonl"
            summ = pair_accuracy_summary(read_records(metrics)) if metrics.is_file() else {}
            for key in PAIR_ACC:
                if key in summ:
                    accs.setdefault(key, []).append(summ[key])
        if not evs:
            continue

        def col(tag: str, key: str = "success_rate") -> str:
            xs = [e[tag][key] for e in evs if tag in e]
            return _spread(xs) if xs else "-"

        print(f"| {name} ({len(evs)} seeds) | {col('bc')} | {col('final')} | {_spread(areas)} | "
              f"{col('final', 'return_mean')} | {col('final', 'invalid_action_rate')} "
              f"| {' / '.join(_spread(accs[k]) if k in accs else '-' for k in PAIR_ACC) if accs else '-'} "
              f"| {statistics.mean(walls):.1f} |")
    rows = [(a, b, *paired(out, a, b)) for a, b in comparisons([v for v in VARIANTS if (out / v).is_dir()])]
    rows = [r for r in rows if r[4]]
    if rows:
        print("\nFinal greedy success paired on the held-out tasks, pooled over the seeds both ran (a task of one seed "
              "is one pair; the pooling treats seeds' tasks as independent, so it is no substitute for the spread "
              "over seeds)")
        print("| variant | against | seeds | tasks solved only by the variant / only by the other | sign test p |")
        print("|---|---|---|---|---|")
        for a, b, gained, lost, seeds_both in rows:
            print(f"| {a} | {b} | {seeds_both} | {gained} / {lost} | {_sign_p(gained, lost):.2g} |")


def comparisons(names: list[str]) -> list[tuple[str, str]]:
    """The pairs worth a paired test: each privileged variant against the same without the privileged text, and
    every variant against the critic-free ``none``."""
    out = [(n, n.replace("+priv", "")) for n in names if "+priv" in n and n.replace("+priv", "") in names]
    return out + [(n, "none") for n in names if n != "none" and "none" in names]


def paired(out: Path, a: str, b: str) -> tuple[int, int, int]:
    """Over the seeds both variants finished: tasks only ``a`` solved, tasks only ``b`` solved (final greedy
    evaluation, matched by task seed), and the number of such seeds."""
    gained = lost = seeds = 0
    for path in sorted((out / a).glob("seed*/eval_final.jsonl")):
        other = out / b / path.parent.name / "eval_final.jsonl"
        if not other.is_file() or not (path.parent / "summary.json").is_file():
            continue
        x = {r["seed"]: r["success"] for r in read_jsonl(path)}
        y = {r["seed"]: r["success"] for r in read_jsonl(other)}
        both = x.keys() & y.keys()
        gained += sum(bool(x[k]) and not y[k] for k in both)
        lost += sum(bool(y[k]) and not x[k] for k in both)
        seeds += 1
    return gained, lost, seeds


def _sign_p(gained: int, lost: int) -> float:
    from scipy.stats import binomtest

    return float(binomtest(gained, gained + lost).pvalue) if gained + lost else 1.0


if __name__ == "__main__":
    main()
