"""Best-of-n with an action critic against the same n candidates picked at random (plain sampling), and what the
critic's picks look like.

``polyturn evaluate --best-of N`` plays the critic's favourite of N sampled candidate turns. Picking one of the N
at random is plain sampling at the same temperature, so the two differ only in the critic's choice. This plays
the same held-out tasks both ways (the same sampling seed) and prints success, invalid actions and turns, then,
over the states whose candidates differ, each kind of action's share among the candidates and among the
critic's picks (``unparseable`` for text that is no action). A critic that reads privileged text runs only with
``--oracle`` (that information does not exist at deployment), as in ``polyturn evaluate``. Run by hand::

    .venv/bin/python benchmarks/best_of.py --actor runs/abl_sql_tiny/action+redist/seed0/ckpt-final \\
        --critic runs/abl_sql_tiny/action+redist/seed0/ckpt-final --n 4 --episodes 200

``--quick`` trains a tiny one-iteration action critic (``critic_compare.py``'s) and plays a few episodes.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from polyturn.acting.checkpoint import held_out_tasks, load_checkpoint, run_actor
from polyturn.cli import _quiet_libraries
from polyturn.envs.actions import FormatError, parse_action
from polyturn.models.critic_text import CriticInput
from polyturn.rollout.best_of import PrivilegedCriticError, deployable_scorer, pick_best
from polyturn.rollout.types import info_valid
from polyturn.train.setup import make_envs


def action_kind(text: str) -> str:
    """The tool an action calls, or ``unparseable``."""
    parsed = parse_action(text)
    return "unparseable" if isinstance(parsed, FormatError) else parsed.tool


class LoggingPick:
    """A scorer for the collector: logs every state's candidates with the critic's scores, and returns either
    those scores (the critic picks) or random ones (a uniform pick: plain sampling)."""

    def __init__(self, critic, n: int, *, random_pick: bool, seed: int) -> None:  # noqa: ANN001 - a CriticScorer
        self.critic, self.n, self.random_pick = critic, n, random_pick
        self.rng = random.Random(seed)
        self.states: list[list[tuple[str, float]]] = []

    def __call__(self, inputs: Sequence[CriticInput]) -> list[float]:
        scores = self.critic(inputs)
        # The collector scores its rows' candidates in one call, n per row in row order.
        if len(inputs) % self.n:
            raise RuntimeError(f"Expected {self.n} candidates per state, got {len(inputs)} in one call")
        for i in range(0, len(inputs), self.n):
            self.states.append([(x.action or "", s) for x, s in zip(inputs[i : i + self.n], scores[i : i + self.n])])
        return [self.rng.random() for _ in scores] if self.random_pick else scores


def pick_shares(states: list[list[tuple[str, float]]]) -> tuple[int, Counter, Counter, dict[str, float]]:
    """Over the states whose candidates differ: their number, each kind's share of the candidates and of the
    critic's favourites (the scores logged, whichever pick was played), and each kind's mean score minus its
    state's mean (how the critic ranks that kind against the others at one state)."""
    base, picked, n = Counter(), Counter(), 0
    offsets: dict[str, list[float]] = {}
    for cands in states:
        if len({a for a, _ in cands}) < 2:
            continue
        n += 1
        mean = sum(s for _, s in cands) / len(cands)
        for a, s in cands:
            base[action_kind(a)] += 1 / len(cands)
            offsets.setdefault(action_kind(a), []).append(s - mean)
        picked[action_kind(cands[pick_best([s for _, s in cands])][0])] += 1
    return n, base, picked, {k: sum(v) / len(v) for k, v in offsets.items()}


def play(ck, critic, *, n: int, episodes: int, temperature: float, seed: int, random_pick: bool,  # noqa: ANN001
         num_envs: int) -> tuple[dict[str, float], LoggingPick]:
    scorer = LoggingPick(critic, n, random_pick=random_pick, seed=seed)
    envs = make_envs(ck.config, min(num_envs, episodes))
    try:
        eps = run_actor(ck.collector(envs, env_id=ck.config.env.id, best_of=n, scorer=scorer),
                        held_out_tasks(ck.config, episodes), temperature=temperature, seed=seed)
    finally:
        for e in envs:
            e.close()
    turns = [t for e in eps for t in e.turns]
    return {"success": sum(e.success for e in eps) / len(eps),
            "invalid": sum(not info_valid(t.info) for t in turns) / max(1, len(turns)),
            "turns": len(turns) / len(eps)}, scorer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actor", help="checkpoint whose actor samples the candidates")
    p.add_argument("--critic", help="checkpoint (or its critic/ directory) of an action-level critic")
    p.add_argument("--oracle", action="store_true", help="allow a critic that reads privileged text (labelled oracle)")
    p.add_argument("--n", type=int, default=4, help="candidates per state")
    p.add_argument("--episodes", type=int, default=200, help="held-out tasks")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a tiny critic trained here, a few episodes")
    p.add_argument("--out", default="runs/best_of_quick", help="--quick: where its runs go")
    args = p.parse_args(argv)
    _quiet_libraries()
    torch.set_num_threads(args.threads)
    if args.quick:
        sys.path.insert(0, str(Path(__file__).parent))
        from critic_compare import quick

        _, runs = quick(Path(args.out))
        args.actor = args.critic = runs["plain"]
        args.episodes, args.n = 6, 2
    if not args.actor or not args.critic:
        p.error("give --actor and --critic (or --quick)")
    if args.n < 2 or args.episodes < 1 or args.temperature <= 0:
        p.error("--n must be >= 2, --episodes >= 1 and --temperature > 0 (candidates are sampled)")
    try:
        ck = load_checkpoint(args.actor)
        critic = deployable_scorer(args.critic, oracle=args.oracle, where="best-of-n")
    except PrivilegedCriticError as e:
        raise SystemExit(str(e)) from None
    except (FileNotFoundError, ValueError, OSError) as e:
        raise SystemExit(f"--actor / --critic: {e}") from None
    label = f"best-of-{args.n}" + (" oracle" if critic.privileged else "")
    rows = {}
    for name, rand in ((f"{label}, the critic's favourite", False), (f"one of the {args.n} at random (plain sampling)", True)):
        rows[name], logged = play(ck, critic, n=args.n, episodes=args.episodes, temperature=args.temperature,
                                  seed=args.seed, random_pick=rand, num_envs=args.num_envs)
        if not rand:
            states, base, picked, offset = pick_shares(logged.states)
    print(f"{ck.config.env.id}, {args.episodes} held-out tasks, T = {args.temperature}, actor {args.actor}, critic "
          f"{args.critic} (reads privileged text: {critic.privileged})")
    print("| pick | success | invalid actions | turns |\n|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['success']:.3f} | {r['invalid']:.3f} | {r['turns']:.2f} |")
    print(f"\nStates with differing candidates (critic's run): {states}")
    print("| action | share of the candidates | share of the critic's picks | score minus its state's mean |\n"
          "|---|---|---|---|")
    for kind in sorted(base, key=lambda k: -base[k]):
        print(f"| {kind} | {base[kind] / max(1, states):.3f} | {picked[kind] / max(1, states):.3f} | "
              f"{offset[kind]:+.3f} |")


if __name__ == "__main__":
    main()
