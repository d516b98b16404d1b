"""Held-out results of training runs, BC vs final, with each environment's own figures.

Reads ``eval_<tag>.jsonl`` (written by ``polyturn train`` for tags ``bc``, ``final`` and their ``_sampled``
variants) from each run directory and prints one markdown row per run and tag: success, mean return and
turns, plus the figures the environments issue asks for:

* CustomerService-v0: error responses (and of them repeated calls) and policy violations per episode, and on
  the forbidden requests: solved, a thought that says "forbids", a refusal replied, the write tried anyway; on
  the others, a refusal replied (refusing where nothing forbids it);
* TwentyQuestions-v0: LMRL-Gym's normalised score, anchored at the run's own demonstrations (50), and how the
  policy plays: guesses a game, games without a guess, questions asked when at most 2 objects fit;
* Negotiation-v0: deal rate and mean worth of the deal to the agent (0-10; 0 without a deal).

Run by hand::

    .venv/bin/python benchmarks/env_results.py runs/customer_service_tiny runs/twenty_questions_tiny
    .venv/bin/python benchmarks/env_results.py --quick   # on a configs/test_tiny.yaml run (benchmarks/quick.py)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

from polyturn.acting.jsonl import read_jsonl
from polyturn.config import ConfigError, load_config

TAGS = ("bc", "final", "bc_sampled", "final_sampled")


def _last_info(record: dict[str, Any]) -> dict[str, Any]:
    turns = record.get("turns") or []
    return dict(turns[-1].get("info") or {}) if turns else {}


def env_figures(env_id: str, records: list[dict[str, Any]], demos: list[dict[str, Any]]) -> dict[str, float]:
    """The environment-specific figures of ``records`` (see the module docstring)."""
    infos = [_last_info(r) for r in records]
    if env_id.startswith("polyturn/CustomerService"):
        # Episode records keep the last step's features (n_errors counts the error responses).
        from polyturn.envs.customer_service.spec import allowed_refusals, forbidden_figures, repeats

        feats = [i.get("features") or {} for i in infos]
        forbidden = {f"forbidden: {k}": v for k, v in forbidden_figures(records).items()}
        allowed = {f"allowed: {k}": v for k, v in allowed_refusals(records).items() if k != "allowed tasks"}
        return {"error responses": fmean(float(f["n_errors"]) for f in feats),
                "of them repeats": fmean(repeats(r) for r in records),
                "policy violations": fmean(float(f["policy_violations"]) for f in feats)} | forbidden | allowed
    if env_id.startswith("polyturn/TwentyQuestions"):
        from polyturn.envs.twenty_questions.score import play_figures, score_records

        if not demos:  # the scale's 50 is the demonstrations' mean return
            raise SystemExit("Expected the run's demonstrations for the normalised score: its demos.jsonl, or "
                             "the file its config.yaml names in bc.demos (run from the directory it was trained in)")
        return {"normalised score": score_records(records, demos)} | play_figures(records)
    if env_id.startswith("polyturn/Negotiation"):
        feats = [i.get("features") or {} for i in infos]
        return {"deal rate": fmean(float(f.get("deal", 0)) for f in feats),
                "mean deal worth": 10 * fmean(float(f.get("deal_worth", 0)) for f in feats)}
    return {}


def run_demos(run: Path) -> list[dict[str, Any]]:
    """The run's demonstrations: its ``demos.jsonl``, else the file its ``config.yaml`` names in ``bc.demos``
    (a run trained on given demonstrations keeps no copy)."""
    path = run / "demos.jsonl"
    if not path.is_file() and (run / "config.yaml").is_file():
        try:
            named = load_config(run / "config.yaml").bc.demos
        except ConfigError:  # a config this polyturn no longer reads: no demonstrations, as without one
            named = None
        path = Path(named) if named else path
    return read_jsonl(path) if path.is_file() else []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", help="run directories of polyturn train")
    p.add_argument("--quick", action="store_true", help="read the tiny run of benchmarks/quick.py (trained if missing)")
    args = p.parse_args()
    if args.quick:
        from quick import tiny_run

        args.runs = [*args.runs, tiny_run()]
    if not args.runs:
        p.error("Expected one or more run directories (or --quick)")
    print("| run | eval | episodes | success | return | turns | other |")
    print("|---|---|---|---|---|---|---|")
    for run in map(Path, args.runs):
        demos = run_demos(run)
        found = False
        for tag in TAGS:
            path = run / f"eval_{tag}.jsonl"
            if not path.is_file():
                continue
            found = True
            recs = read_jsonl(path)
            env_id = str(recs[0].get("env_id", "")) if recs else ""
            other = env_figures(env_id, recs, demos) if recs else {}
            extra = ", ".join(f"{k} {v:.1f}" if k == "normalised score" else f"{k} {v:.2f}" if isinstance(v, float)
                              else f"{k} {v}" for k, v in other.items())
            print(f"| {run.name} | {tag} | {len(recs)} | {fmean(float(r['success']) for r in recs):.3f} "
                  f"| {fmean(float(r['return']) for r in recs):.2f} "
                  f"| {fmean(len(r.get('turns') or []) for r in recs):.2f} | {extra} |")
        if not found:
            print(f"{run}: no eval_*.jsonl (has the run finished its BC evaluation?)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
