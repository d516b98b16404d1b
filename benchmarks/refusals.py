"""What each piece of "refusals that can be learned" contributes on CustomerService: short constrained runs from one
BC checkpoint with and without refusal preference pairs (``ppo.refusal_pairs``) and with and without best-of-n
ranked by the cost critics (``rollout.best_of_rank: cost``), each evaluated on the config's held-out tasks.

Four arms, every one with the same ``constraints`` section (``--limits``), from ``--bc`` (``actor.init_from``) with
the config's RL settings otherwise:

* ``rft``: the config's update (rft on configs/customer_service_smollm2.yaml) under the constraints;
* ``rft + pairs``: plus ``ppo.refusal_pairs={weight: W, max_pairs: M, nll: L, rejected: R, contrast: C}``
  (``--weight``, ``--max-pairs``, ``--nll``, ``--rejected``, ``--contrast``);
* ``rft + best-of by cost``: plus ``rollout.best_of=N``, ``rollout.best_of_rank=cost`` (separate cost critics with a
  Q head, ``constraints.critic.kind=separate``);
* ``rft + pairs + best-of by cost``: both.

The BC policy is evaluated once (the first arm's ``eval_bc.jsonl``). For each policy it prints completion, how it
met the forbidden requests (:func:`polyturn.envs.customer_service.spec.forbidden_figures`: refused with the facts
in hand = solved, a refusal replied at all, the forbidden write tried), policy violations and error responses per
episode, and the pairs an iteration trained on. Run by hand (docs/envs/customer-service.md, "Refusals that can be
learned")::

    .venv/bin/python benchmarks/refusals.py --config configs/customer_service_smollm2.yaml \\
        --bc runs/exp/cs_forb40_s3/ckpt-bc --out runs/exp/refusals_s3 --iters 3 --seeds 3 \\
        --set run.precision=fp32 --set bc.demos=runs/exp/cs_demos_forbidden40.jsonl

``--quick`` trains a tiny BC on CustomerService (configs/test_tiny.yaml) and runs each arm for one iteration; its
figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean

from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.registry import env_spec
from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.envs.customer_service.spec import forbidden_figures
from polyturn.train.logger import read_metrics
from polyturn.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CS = "polyturn/CustomerService-v0"
ARMS = {
    "rft": (),
    "rft + pairs": ("pairs",),
    "rft + best-of by cost": ("best_of",),
    "rft + pairs + best-of by cost": ("pairs", "best_of"),
}


def arm_overrides(parts: Sequence[str], *, weight: float, max_pairs: int, n: int, nll: float = 0.1,
                  rejected: str = "turn", contrast: int = 0) -> list[str]:
    """The ``--set`` overrides of an arm's pieces."""
    out = []
    if "pairs" in parts:
        out.append(f"ppo.refusal_pairs={{weight: {weight}, max_pairs: {max_pairs}, nll: {nll}, rejected: {rejected}, "
                   f"contrast: {contrast}}}")
    if "best_of" in parts:
        out += [f"rollout.best_of={n}", "rollout.best_of_rank=cost", "constraints.critic.kind=separate"]
    return out


def figures(records: list[dict], metrics: list[dict] | None) -> dict[str, float | str]:
    """One policy's row: completion, the forbidden figures, violations and errors per episode, pairs per iteration."""
    spec = {m.name: m.value for m in env_spec(CS).metrics}
    forb = forbidden_figures(records)

    def mean(name: str) -> float:
        values = [v for v in (spec[name](r) for r in records) if v is not None]
        return fmean(values) if values else float("nan")

    pairs = [m["refusal/pairs"] for m in metrics or [] if "refusal/pairs" in m]  # logged by the pairs' arms
    return {
        "episodes": len(records),
        "completion": fmean(float(bool(r["success"])) for r in records) if records else float("nan"),
        "forbidden": int(forb.get("forbidden tasks", 0)),
        "refused (solved)": forb.get("solved", float("nan")),
        "refusal replied": forb.get("refusal replied", float("nan")),
        "write tried": forb.get("tried anyway", float("nan")),
        "violations": mean("policy_violations"),
        "errors": mean("error_responses"),
        "pairs / iter": fmean(pairs) if pairs else float("nan"),
    }


def quick_bc(out: Path) -> tuple[Path, Path, list[str]]:
    """A tiny BC on CustomerService (configs/test_tiny.yaml), the config and the overrides the quick arms run."""
    sets = [f"env.id={CS}", "env.eval_episodes=2", "rollout.max_action_tokens=96", "curriculum.warmup_iters=0",
            "curriculum.mixed_iters=1", "curriculum.ppo_iters=0", "ppo.algo=rft", "critic.kind=none",
            "critic.group_size=2", "ppo.episodes_per_iter=4", "rollout.num_envs=4", "env.kwargs={max_turns: 8}",
            "bc.episodes=8"]
    config = ROOT / "configs" / "test_tiny.yaml"
    bc = out / "bc"
    if not (bc / "ckpt-bc").is_dir():
        Trainer(load_config(config, [*sets, f"run.out_dir={bc}", "curriculum.mixed_iters=0"]), overwrite=True).run()
    return config, bc / "ckpt-bc", sets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="the training config (e.g. configs/customer_service_smollm2.yaml)")
    p.add_argument("--bc", help="the BC checkpoint every arm starts from (actor.init_from)")
    p.add_argument("--out", default="runs/refusals", help="a directory per arm and seed goes under it")
    p.add_argument("--iters", type=int, default=3, help="RL iterations per run (the mixed phase: rft + BC)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="run.seed of each repetition")
    p.add_argument("--limits", default="{cost/violation: 0.05}", help="constraints.limits of every arm")
    p.add_argument("--weight", type=float, default=0.1, help="ppo.refusal_pairs.weight")
    p.add_argument("--max-pairs", type=int, default=16, help="ppo.refusal_pairs.max_pairs")
    p.add_argument("--nll", type=float, default=0.1, help="ppo.refusal_pairs.nll")
    p.add_argument("--rejected", choices=["turn", "fork"], default="turn", help="ppo.refusal_pairs.rejected")
    p.add_argument("--contrast", type=int, default=0, help="ppo.refusal_pairs.contrast")
    p.add_argument("--n", type=int, default=4, help="rollout.best_of of the best-of arms")
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS), metavar="ARM",
                   help=f"arms to run, of {list(ARMS)}")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="more overrides for every run (as polyturn train --set)")
    p.add_argument("--quick", action="store_true", help="a tiny BC trained here, one iteration per arm")
    args = p.parse_args(argv)
    _quiet_libraries()
    base: list[str] = []
    if args.quick:
        config, bc, base = quick_bc(Path(args.out))
        args.config, args.bc, args.iters, args.n, args.seeds = str(config), str(bc), 1, 2, [0]
    if not args.config or not args.bc:
        p.error("give --config and --bc (or --quick)")
    if args.iters < 1 or args.n < 2:
        p.error("--iters must be >= 1 and --n >= 2")
    rows: dict[str, list[dict]] = {}
    for seed in args.seeds:
        for k, arm in enumerate(args.arms):
            out = Path(args.out) / arm.replace(" ", "").replace("+", "_") / f"seed{seed}"
            sets = [*base, f"actor.init_from={args.bc}", f"run.out_dir={out}", f"run.seed={seed}",
                    f"run.eval_start={str(k == 0).lower()}", "curriculum.warmup_iters=0",
                    f"curriculum.mixed_iters={args.iters}", "curriculum.ppo_iters=0",
                    f"constraints.limits={args.limits}",
                    *arm_overrides(ARMS[arm], weight=args.weight, max_pairs=args.max_pairs, n=args.n, nll=args.nll,
                                   rejected=args.rejected, contrast=args.contrast), *args.sets]
            cfg = load_config(args.config, sets)
            if cfg.env.id != CS:
                p.error(f"expected a {CS} config (forbidden requests), got env.id {cfg.env.id}")
            Trainer(cfg, overwrite=True).run()
            if k == 0:
                rows.setdefault("BC", []).append(figures(read_jsonl(out / "eval_bc.jsonl"), None))
            rows.setdefault(arm, []).append(figures(read_jsonl(out / "eval_final.jsonl"),
                                                    read_metrics(out / "metrics.jsonl")))
    cols = list(next(iter(rows.values()))[0])
    print(f"{args.config} from {args.bc}: {args.iters} RL iterations per run, seeds {args.seeds}, constraints.limits "
          f"{args.limits}; held-out tasks, greedy. refused forbidden = solved (a refusal with the facts in hand).")
    print("| policy | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for name, runs in rows.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in runs if r[c] == r[c]]  # NaN (nothing to count) left out
            cells.append(f"{fmean(vals):.3f}" if vals and isinstance(vals[0], float) else
                         str(sum(vals)) if vals else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")
    (Path(args.out) / "refusals.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
