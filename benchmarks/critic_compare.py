"""Two critics on the same episodes: how well each predicts returns (value critics), or how each ranks candidate
turns (action-level critics), and where they differ.

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

With two action-level critics (``critic.kind: action``, e.g. an ablation's ``action+priv`` and ``action`` runs) it
samples ``--candidates`` candidate turns at ``--states`` states of the played episodes and prints, per turn index,
how the two critics rank them: how often they pick the same favourite, the mean Kendall tau between their
rankings, how much each spreads its scores, and where each puts the turn the actor actually played::

    .venv/bin/python benchmarks/critic_compare.py --actor runs/ablation_negotiation/bc/ckpt-bc \
        --critic priv=runs/ablation_negotiation/action+priv/seed0 \
        --critic plain=runs/ablation_negotiation/action/seed0 --episodes 100 --candidates 6

``--quick`` trains two tiny action critics (with and without the privileged text) for one iteration and compares
them on a few episodes (a smoke test of the script; the figures mean nothing).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from polyturn.algos.gae import turn_gae
from polyturn.algos.value import explained_variance
from polyturn.cli import _quiet_libraries
from polyturn.eval import records as R
from polyturn.eval.diagnose import discounted_returns
from polyturn.acting.policies import resolve_policy
from polyturn.acting.checkpoint import LoadedCheckpoint, held_out_tasks, load_checkpoint, run_actor
from polyturn.models.critic import SeparateCritic
from polyturn.rollout.types import Episode
from polyturn.train.critics import SeparateLearner, turn_tensors

#: --quick: the ablation's tiny settings for two one-iteration action-critic runs.
QUICK_ITERS = ["curriculum.warmup_iters=0", "curriculum.mixed_iters=1", "curriculum.ppo_iters=0", "env.eval_episodes=2",
               "critic.kind=action", "ppo.algo=critic_pg", "critic.group_size=2"]


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


def action_compare(loaded: LoadedCheckpoint, critics: dict[str, str], eps: list[Episode], *, states: int,
                   candidates: int, temperature: float, turns: int) -> None:
    """Per turn index: how two action critics rank ``candidates`` sampled candidate turns at up to ``states`` states."""
    import random

    from scipy.stats import kendalltau

    from polyturn.models.action_critic import load_action_critic
    from polyturn.models.critic_text import CriticInput
    from polyturn.rollout.candidates import action_text, sample_candidates, turn_context

    actor, cfg = loaded.actor, loaded.config
    pool = [(i, t) for i, ep in enumerate(eps) for t in range(len(ep.turns))]
    picked = random.Random(0).sample(pool, min(states, len(pool)))
    gen = torch.Generator(device=actor.device).manual_seed(0)
    cands = sample_candidates(actor, [turn_context(eps[i], t) for i, t in picked], k=candidates,
                              temperature=temperature, max_new_tokens=cfg.rollout.max_action_tokens, generator=gen)
    inputs, played = [], []
    for (i, t), acts in zip(picked, cands):
        ep, turn = eps[i], eps[i].turns[t]
        texts = [turn.action] + [action_text(actor, a) for a in acts]  # the played turn first, then the candidates
        inputs.append([CriticInput(task=ep.question, history=ep.history(t), privileged=turn.privileged, action=x,
                                   features=turn.features) for x in texts])
        played.append(t)
    scores = {}
    for name, path in critics.items():
        critic = load_action_critic(path).eval()
        with torch.no_grad():
            flat = critic.scores([x for group in inputs for x in group]).float().numpy()
        scores[name] = flat.reshape(len(inputs), candidates + 1)
        print(f"{name}: {path} ({'reads' if critic.include_privileged else 'does not read'} the privileged text)")
    a, b = list(scores)[:2]
    print(f"\n{len(picked)} states, {candidates} sampled candidates each (T={temperature}) + the played turn")
    print(f"| turn | states | same favourite | Kendall tau {a} vs {b} | score std {a} | score std {b} "
          f"| played turn's rank {a} | played turn's rank {b} |")
    print("|---|---|---|---|---|---|---|---|")
    idx = np.array(played)
    for t in sorted(set(played))[:turns]:
        rows = np.nonzero(idx == t)[0]
        sa, sb = scores[a][rows], scores[b][rows]
        same = np.mean([np.argmax(x[1:]) == np.argmax(y[1:]) for x, y in zip(sa, sb)])
        taus = [kendalltau(x[1:], y[1:]).statistic for x, y in zip(sa, sb)]
        taus = [x for x in taus if np.isfinite(x)]
        rank = {n: np.mean([(s[0] < s[1:]).sum() + 1 for s in scores[n][rows]]) for n in (a, b)}
        print(f"| {t + 1} | {len(rows)} | {same:.2f} | {np.mean(taus) if taus else float('nan'):+.2f} "
              f"| {sa[:, 1:].std(1).mean():.3f} | {sb[:, 1:].std(1).mean():.3f} | {rank[a]:.2f} | {rank[b]:.2f} |")


def quick(out: Path) -> tuple[str, dict[str, str]]:
    """Train two tiny one-iteration action critics (privileged and not) from one BC run; their checkpoints."""
    import sys

    from polyturn.config import load_config
    from polyturn.train.trainer import Trainer

    sys.path.insert(0, str(Path(__file__).parent))
    from ablation import QUICK  # the ablation's tiny settings

    runs = {}
    for name, priv in (("priv", "true"), ("plain", "false")):
        run = out / name
        if not (run / "summary.json").is_file():
            Trainer(load_config("configs/negotiation_tiny.yaml", [f"run.out_dir={run}", *QUICK, *QUICK_ITERS,
                                                                 f"critic.privileged={priv}"]), overwrite=True).run()
        runs[name] = str(run)
    return runs["priv"], runs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actor", help="checkpoint whose actor plays the episodes")
    p.add_argument("--critic", action="append", metavar="NAME=CHECKPOINT",
                   help="a checkpoint (or run) with a separate or an action-level critic (give two of one kind)")
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--states", type=int, default=200, help="action critics: states whose candidates are ranked")
    p.add_argument("--candidates", type=int, default=4, help="action critics: candidate turns per state")
    p.add_argument("--quick", action="store_true", help="two tiny action critics trained here, a few episodes")
    p.add_argument("--out", default="runs/critic_compare_quick", help="--quick: where its two runs go")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--group", choices=["privileged", "outcome", "action"], default="privileged",
                   help="how to group turns in the last table: the privileged text's first sentence, the episode's "
                        "success, or the turn's tool")
    p.add_argument("--turns", type=int, default=8, help="turn indices shown in the per-turn table")
    args = p.parse_args(argv)
    _quiet_libraries()
    torch.set_num_threads(1)
    if args.quick:
        args.actor, critics = quick(Path(args.out))
        args.episodes, args.states = 4, 8
    else:
        if not args.actor or not args.critic or len(args.critic) != 2:
            p.error("give --actor and two --critic NAME=CHECKPOINT (or --quick)")
        critics = dict(c.split("=", 1) for c in args.critic)
    spec = resolve_policy(args.actor)
    cfg = spec.config
    assert cfg is not None
    loaded = load_checkpoint(spec)
    eps = run_actor(loaded, held_out_tasks(cfg, args.episodes), temperature=args.temperature, seed=0,
                    label="critic-compare")
    kinds = {resolve_policy(c).config.critic.kind for c in critics.values()}
    if kinds == {"action"}:
        action_compare(loaded, critics, eps, states=args.states, candidates=args.candidates,
                       temperature=args.temperature or 1.0, turns=args.turns)
        return
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
