"""Two separate critics on the same episodes: how well each predicts returns, and where their advantages differ.

The critic ablation asks whether reading privileged text helps the critic. This plays one actor on held-out
seeds (sampled, as in training), scores every turn with each critic (e.g. the final critics of an ablation's
``separate+priv`` and ``separate`` runs), and prints, per critic, explained variance and MSE against the
realised returns (in the env's reward units), then the mean absolute difference of their turn-level GAE
advantages by turn index and by a grouping of the episodes (``--group privileged``: the privileged text up to its
first period, for Negotiation the opponent's strategy; ``--group outcome``: solved or not; ``--group action``:
the env's action type of the turn (``invalid`` for a call it refused), and for the episode's last turn whether it solved the task), with each group's
explained variance per critic. Run by hand::

    .venv/bin/python benchmarks/critic_compare.py --actor runs/negotiation_tiny/ckpt-bc \\
        --critic priv=runs/ablation_negotiation/separate+priv/seed0/ckpt-final \\
        --critic plain=runs/ablation_negotiation/separate/seed0/ckpt-final --episodes 200

``--quick`` compares the final and the BC critics of the tiny run of ``benchmarks/quick.py`` on 8 episodes of
its final actor: that it runs.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from polyturn.acting.checkpoint import held_out_tasks, load_checkpoint, run_actor
from polyturn.acting.policies import resolve_policy
from polyturn.algos.gae import turn_gae
from polyturn.algos.value import explained_variance
from polyturn.cli import _quiet_libraries
from polyturn.eval import records as R
from polyturn.eval.diagnose import discounted_returns
from polyturn.models.critic import SeparateCritic
from polyturn.rollout.types import Episode
from polyturn.train.critics import SeparateLearner, turn_tensors


def _ev(v: np.ndarray, g: np.ndarray) -> float:
    v, g = torch.from_numpy(np.asarray(v, dtype=np.float64)), torch.from_numpy(np.asarray(g, dtype=np.float64))
    return float(explained_variance(v, g, torch.ones(len(v), dtype=torch.bool)))


def _group(how: str, record: dict, k: int) -> str:
    """Turn ``k``'s group in an episode record: its privileged text's first sentence, the episode's outcome, or
    the env's action type (for the last turn, with the outcome)."""
    outcome = "solved" if record["success"] else "not solved"
    if how == "outcome":
        return outcome
    if how == "action":
        last = k == len(record["turns"]) - 1
        return R.action_type(record["turns"][k]) + (f" (last turn, {outcome})" if last else "")
    return record["privileged"].split(".")[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actor", help="checkpoint whose actor plays the episodes")
    p.add_argument("--critic", action="append", default=[], metavar="NAME=CHECKPOINT",
                   help="a checkpoint with a separate critic (give two)")
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--group", choices=["privileged", "outcome", "action"], default="privileged",
                   help="how to group turns in the last table: the privileged text's first sentence, the episode's "
                        "success, or the turn's tool")
    p.add_argument("--turns", type=int, default=8, help="turn indices shown in the per-turn table")
    p.add_argument("--quick", action="store_true",
                   help="the final and BC critics of benchmarks/quick.py's tiny run, 8 episodes of its final actor")
    args = p.parse_args()
    if args.quick:
        from quick import tiny_run

        run = tiny_run()
        args.actor, args.episodes = str(run / "ckpt-final"), 8
        args.critic = [f"final={run / 'ckpt-final'}", f"bc={run / 'ckpt-bc'}"]
    if not args.actor or len(args.critic) < 2:
        p.error("Expected --actor CHECKPOINT and two --critic NAME=CHECKPOINT (or --quick)")
    _quiet_libraries()
    torch.set_num_threads(1)
    critics = dict(c.split("=", 1) for c in args.critic)
    spec = resolve_policy(args.actor)
    cfg = spec.config
    assert cfg is not None
    eps = run_actor(load_checkpoint(spec), held_out_tasks(cfg, args.episodes), temperature=args.temperature, seed=0,
                    label="critic-compare")
    tt = turn_tensors(eps)
    gamma, lam, scale = cfg.curriculum.gamma.end, cfg.ppo.lam, cfg.ppo.reward_scale
    mask = tt["mask"].bool()
    returns = np.array([g for ep in eps for g in discounted_returns([t.reward for t in ep.turns], gamma)])
    turn_idx = np.array([t for ep in eps for t in range(len(ep.turns))])
    group = np.array([_group(args.group, rec, k) for rec in map(Episode.to_record, eps)
                      for k in range(len(rec["turns"]))])
    adv, vals = {}, {}
    for name, ckpt in critics.items():
        ccfg = resolve_policy(ckpt).config
        assert ccfg is not None and ccfg.critic.kind == "separate", f"{ckpt}: expected a separate critic"
        learner = SeparateLearner(SeparateCritic.from_pretrained(Path(ckpt) / "critic"), ccfg.critic)
        v, nv = learner.values(eps)
        a, _ = turn_gae(tt["rewards"] * scale, v, nv, tt["terminated"], tt["mask"], gamma=gamma, lam=lam)
        vals[name] = (v / scale)[mask].numpy()
        adv[name] = (a / scale)[mask].numpy()
    print(f"{len(eps)} episodes, {mask.sum().item()} turns, actor {args.actor} at T={args.temperature}; "
          f"success {np.mean([ep.success for ep in eps]):.3f}")
    print("| critic | explained variance | MSE |")
    print("|---|---|---|")
    for name, v in vals.items():
        print(f"| {name} | {_ev(v, returns):.3f} | {np.mean((v - returns) ** 2):.3f} |")
    a_name, b_name = list(adv)[:2]
    diff = np.abs(adv[a_name] - adv[b_name])
    corr = float(np.corrcoef(adv[a_name], adv[b_name])[0, 1])
    print(f"\nadvantage correlation {a_name} vs {b_name}: {corr:.3f}; mean |difference| {diff.mean():.3f}")
    print(f"| turn | turns | mean abs diff | EV {a_name} | EV {b_name} |")
    print("|---|---|---|---|---|")
    for t in sorted(set(turn_idx.tolist()))[: args.turns]:
        m = turn_idx == t
        print(f"| {t + 1} | {m.sum()} | {diff[m].mean():.3f} | {_ev(vals[a_name][m], returns[m]):.3f} "
              f"| {_ev(vals[b_name][m], returns[m]):.3f} |")
    print(f"\n| {args.group} group | turns | mean advantage {a_name} | mean advantage {b_name} | mean abs diff "
          f"| EV {a_name} | EV {b_name} |")
    print("|---|---|---|---|---|---|---|")
    by = defaultdict(list)
    for k, g in enumerate(group.tolist()):
        by[g].append(k)
    for g, ks in sorted(by.items()):
        m = np.array(ks)
        print(f"| {g} | {len(ks)} | {adv[a_name][m].mean():+.3f} | {adv[b_name][m].mean():+.3f} | {diff[m].mean():.3f} "
              f"| {_ev(vals[a_name][m], returns[m]):.3f} "
              f"| {_ev(vals[b_name][m], returns[m]):.3f} |")


if __name__ == "__main__":
    main()
