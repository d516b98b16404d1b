"""Does a policy know *when* to refuse? Its choice at the fork between refusing and carrying the request out, at the
held-out states where a refusal is due and at those where the request is allowed, without training anything.

The exact expert (in the checkpoint's own ``bc.expert_options`` style) plays held-out tasks; each episode is replayed
through the checkpoint's actor as forced turns, so the contexts are the ones the actor would read. At every state the
env marks forbidden (``info["forbidden"]``) and every state it marks allowed (``info["allowed"]``) before the
customer's yes, two turns are written with the expert's facts: the refusal ("...; the policy forbids it: ...") and
the expert's step that carries the request on ("...; the policy allows refund. Ask for a yes."), the spec's refusal
and contrast hooks' pairs, cut where the two part, which is the verdict token (``train/refusals.py``'s fork). The
actor's probability of the refusal's token against the other there is P(refuse) at the state. Printed per checkpoint:

* ``P(refuse)``, mean over the forbidden states and over the allowed ones, and the share of each above 0.5 (the
  greedy decision at the fork);
* ``AUC``: the probability that a forbidden state gets a higher P(refuse) than an allowed one (0.5: it refuses
  regardless of the facts; 1: it separates them), from ``scipy.stats.mannwhitneyu``.

A run whose refusals rise at both kinds of states learns *how often*, not *when* (docs/envs/customer-service.md).
By hand, on checkpoints of CustomerService runs::

    .venv/bin/python benchmarks/refusal_fork.py runs/cs_con8_s2/ckpt-bc runs/cs_con8_s2/ckpt-final --tasks 200

``--quick`` trains a tiny BC on CustomerService (configs/test_tiny.yaml) and measures it on a few tasks; its
figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import torch
from scipy.stats import mannwhitneyu

from polyturn.acting.checkpoint import held_out_tasks, load_checkpoint
from polyturn.acting.episodes import run_episode
from polyturn.acting.registry import env_spec, make_env, make_expert
from polyturn.cli import _quiet_libraries
from polyturn.config import load_config
from polyturn.envs.spec import load_attr
from polyturn.train.pairs import summed_logprobs
from polyturn.train.refusals import allowed_states, forbidden_states, written, written_pairs
from polyturn.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CS = "polyturn/CustomerService-v0"


def fork_choices(checkpoint: str | Path, *, tasks: int, num_envs: int = 16) -> dict[str, list[float]]:
    """P(refuse) at each held-out forbidden state and each allowed one of ``tasks`` held-out tasks."""
    t0 = time.time()
    ckpt = load_checkpoint(checkpoint)
    cfg, actor, settings = ckpt.config, ckpt.actor, ckpt.settings
    spec = env_spec(cfg.env.id)
    if spec.refusals is None or spec.contrasts is None:
        raise ValueError(f"Expected an env whose spec writes refusals and contrasts (EnvSpec.refusals, "
                         f"EnvSpec.contrasts), got {cfg.env.id} for {checkpoint}: only such envs mark the states")
    options = dict(cfg.bc.expert_options or {})
    env = make_env(cfg.env.id, cfg.env.kwargs)
    try:
        expert = make_expert(env, noise=0.0, seed=0, options=options)
        records = [run_episode(env, expert, seed=t["seed"]) for t in held_out_tasks(cfg, tasks)]
    finally:
        env.close()
    # Replayed as forced turns: the contexts the actor reads, and the env's marks in each turn's info.
    replay = [{"seed": r["seed"], "prefix": [written(actor, settings, t["action"]).ids for t in r["turns"]]}
              for r in records]
    envs = [make_env(cfg.env.id, cfg.env.kwargs).unwrapped for _ in range(max(1, min(num_envs, len(replay))))]
    try:
        collector = ckpt.collector(envs, env_id=cfg.env.id)
        with torch.no_grad():
            episodes = collector.collect(replay, temperature=1.0, generator=torch.Generator().manual_seed(0))
    finally:
        for e in envs:
            e.close()
    print(f"{checkpoint}: {len(episodes)} expert episodes replayed in {time.time() - t0:.0f} s", file=sys.stderr)
    refusals = written_pairs(episodes, forbidden_states(episodes), actor=actor, settings=settings,
                             hook=before_the_yes(load_attr(spec.refusals)), expert_options=options,
                             rejected_part="fork")
    allowed = written_pairs(episodes, allowed_states(episodes), actor=actor, settings=settings,
                            hook=before_the_yes(load_attr(spec.contrasts)), expert_options=options,
                            rejected_part="fork")
    out: dict[str, list[float]] = {"forbidden": [], "allowed": []}
    with torch.no_grad():
        for kind, pairs in (("forbidden", refusals), ("allowed", allowed)):
            if not pairs:
                continue
            lp = summed_logprobs(actor, pairs, temperature=1.0, budget=cfg.actor.microbatch_tokens,
                                 chosen_prefix=True, share_context=True)  # each pair's context run once
            chosen = torch.sigmoid(lp[:, 2] - lp[:, 1])  # the chosen turn's fork token against the rejected's
            # Forbidden: the refusal is chosen; allowed: the expert's step is, and the refusal rejected.
            out[kind] = [float(p) for p in (chosen if kind == "forbidden" else 1.0 - chosen)]
    return out


def before_the_yes(hook: Any) -> Any:
    """A spec hook (refusals, contrasts) at the states before the customer's yes only: there the refusal and the
    question for the yes part at the verdict token; after the yes the write parts from a refusal at the first."""
    def at_the_verdict(facts: Mapping[str, Any], options: Mapping[str, Any]) -> tuple[str, str] | None:
        return None if facts["confirmed"] else hook(facts, options)
    return at_the_verdict


def summary(choices: dict[str, list[float]]) -> dict[str, float]:
    """Means, greedy shares and the AUC of P(refuse) between forbidden and allowed states."""
    pos, neg = choices["forbidden"], choices["allowed"]
    row = {"forbidden states": float(len(pos)), "allowed states": float(len(neg))}
    for name, xs in (("forbidden", pos), ("allowed", neg)):
        row[f"P(refuse) {name}"] = fmean(xs) if xs else float("nan")
        row[f"refused {name}"] = fmean(float(x > 0.5) for x in xs) if xs else float("nan")
    row["AUC"] = (float(mannwhitneyu(pos, neg).statistic) / (len(pos) * len(neg))) if pos and neg else float("nan")
    return row


def quick_bc(out: Path) -> Path:
    """A tiny BC on CustomerService (configs/test_tiny.yaml)."""
    sets = [f"env.id={CS}", "env.eval_episodes=2", "rollout.max_action_tokens=96", "curriculum.warmup_iters=0",
            "curriculum.mixed_iters=0", "curriculum.ppo_iters=0", "bc.episodes=8", f"run.out_dir={out / 'bc'}"]
    if not (out / "bc" / "ckpt-bc").is_dir():
        Trainer(load_config(ROOT / "configs" / "test_tiny.yaml", sets), overwrite=True).run()
    return out / "bc" / "ckpt-bc"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="*", help="checkpoint directories of CustomerService runs")
    p.add_argument("--tasks", type=int, default=200, help="held-out tasks the expert plays (from env.eval_seed_start)")
    p.add_argument("--json", help="also write the rows and every state's P(refuse) to this file")
    p.add_argument("--quick", action="store_true", help="train a tiny BC under --out and measure it on 12 tasks")
    p.add_argument("--out", default="runs/refusal_fork", help="where --quick trains its tiny BC")
    args = p.parse_args(argv)
    _quiet_libraries()
    if args.quick:
        args.checkpoints, args.tasks = [str(quick_bc(Path(args.out)))], 12
    if not args.checkpoints:
        p.error("give one or more checkpoint directories (or --quick)")
    if args.tasks < 1:
        p.error(f"--tasks must be at least 1, got {args.tasks}")
    rows, raw = {}, {}
    for ckpt in args.checkpoints:
        try:
            raw[ckpt] = fork_choices(ckpt, tasks=args.tasks)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        rows[ckpt] = summary(raw[ckpt])
        print(f"{ckpt}: {json.dumps({k: round(v, 3) for k, v in rows[ckpt].items()})}", file=sys.stderr)
    cols = ["forbidden states", "P(refuse) forbidden", "refused forbidden", "allowed states", "P(refuse) allowed",
            "refused allowed", "AUC"]
    print(f"\nThe fork between refusing and carrying out, {args.tasks} held-out tasks played by the exact expert\n")
    print("| checkpoint | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for ckpt, row in rows.items():
        cells = [f"{int(row[c])}" if c.endswith("states") else f"{row[c]:.3f}" for c in cols]
        print(f"| {ckpt} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "choices": raw}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
