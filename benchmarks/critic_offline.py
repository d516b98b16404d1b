"""Can an action-level critic learn which turn decided an episode? Offline, on one fixed set of turn pairs.

In the RL runs (docs/action-critic.md) the action critic trains on the ~130 turn pairs an iteration's branches
give and is measured on the next iteration's, while the policy moves under it. This takes that question out of
the loop: one actor plays training tasks, ``--k`` branches are played from each of ``--states`` states of those
episodes (the prefix replayed, as ``critic.branch_states`` does), and every two attempts from the same state whose
turns there differ and whose returns differ make a (better turn, worse turn) pair. The pairs are split by task
into training and held-out sets, once, and cached (``--pairs``), so every critic sees the same ones.

One continuation per attempt labels a pair by that continuation's luck as much as by the turn. With
``--continuations M`` each distinct turn at a state (the attempts that took it are merged) is played on M more
times from the state after it, and two turns make a pair when their mean returns differ by more than
``--min-gap``: lower-noise labels. The play also reports how often the one-continuation label of a pair of
attempts disagrees with the averaged one (``single_label_flipped``).

Each ``--critic NAME=key=value,...`` (overrides of the checkpoint's ``critic`` section, ``kind: action`` implied)
is trained by the turn-level Bradley-Terry loss on the training pairs for ``--epochs`` passes, and its held-out
accuracy (the better turn scored higher, a tie counting half; chance 0.5) is printed before training and after
each pass, with the training loss, the accuracy on as many training pairs and the pass's wall time. Run by hand,
e.g. the scratch and the pretrained SmolLM2 critic, each with and without the opponent's values, on
Negotiation::

    .venv/bin/python benchmarks/critic_offline.py --actor runs/abl_neg_pretrain/bc/ckpt-bc --states 512 \\
        --pairs runs/critic_offline/neg_pairs.pkl --epochs 3 \\
        --critic scratch+priv=encoder=scratch,privileged=true --critic scratch=encoder=scratch,privileged=false \\
        --critic smollm2+priv=encoder=causal,path=smollm2-135m,param=head,privileged=true,lr=1e-5 \\
        --critic smollm2=encoder=causal,path=smollm2-135m,param=head,privileged=false,lr=1e-5

``--quick`` trains a small Negotiation BC actor (~30 s), plays a few states with it and trains two tiny critics
for one pass (a smoke test of the script; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import pickle
import random
import time
from pathlib import Path

import torch

from polyturn.acting.checkpoint import load_checkpoint
from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.policies import resolve_policy
from polyturn.cli import _quiet_libraries
from polyturn.console import RichReporter
from polyturn.config import ConfigError, CriticConfig, TrainConfig, parse_overrides
from polyturn.runtime import Runtime
from polyturn.rollout.branches import BranchPoint, branch_points, branch_tasks, replayed
from polyturn.rollout.types import Episode
from polyturn.train.critics.action import ActionLearner, TurnPair, branch_pairs
from polyturn.train.critics import state_input
from polyturn.train.critics import build_critic
from polyturn.train.setup import make_envs


def play_pairs(actor_path: str, *, tasks: int, states: int, k: int, temperature: float | None,
               seed: int, rep: RichReporter, continuations: int = 0, min_gap: float = 0.0) -> tuple[
                   list[TurnPair], list[int], TrainConfig, dict[str, float]]:
    """Turn pairs from ``k`` branches at ``states`` states of ``tasks`` episodes (one per task, on seeds far past
    the ones BC and RL train on), with each pair's task seed; labelled by mean returns over ``continuations``
    more plays of each turn when that is > 0."""
    loaded = load_checkpoint(actor_path)
    cfg = loaded.config
    temp = cfg.curriculum.temperature.start if temperature is None else temperature
    envs = make_envs(cfg, min(64, tasks))
    try:
        return _play(loaded.collector(envs, env_id=cfg.env.id), cfg, tasks=tasks, states=states, k=k, temp=temp,
                     seed=seed, device=loaded.actor.device, rep=rep, continuations=continuations,
                     min_gap=min_gap)
    finally:
        for e in envs:
            e.close()


def _play(collector, cfg: TrainConfig, *, tasks: int, states: int, k: int, temp: float, seed: int,  # noqa: ANN001
          device: torch.device, rep: RichReporter, continuations: int = 0, min_gap: float = 0.0) -> tuple[
              list[TurnPair], list[int], TrainConfig, dict[str, float]]:
    """:func:`play_pairs` with its environments open."""
    start = cfg.env.train_seed_start + 5_000_000  # away from the seeds BC and RL train on
    todo = [{"seed": start + i, "options": {}} for i in range(tasks)]
    gen = torch.Generator(device=device).manual_seed(seed)
    rep.start("episodes", len(todo))
    episodes = collector.collect(todo, temperature=temp, generator=gen, progress=rep.advance)
    points = branch_points(episodes, states, random.Random(seed))
    rep.start("branches", len(points) * k)
    branches = collector.collect(branch_tasks(todo, points, episodes, k=k), temperature=temp, generator=gen,
                                 progress=rep.advance)
    stats: dict[str, float] = {"success": sum(ep.success for ep in episodes) / len(episodes)}
    if continuations > 0:
        groups = [replayed_group(episodes[pt.episode], branches[n * k : (n + 1) * k], pt.turn)
                  for n, pt in enumerate(points)]
        jobs = continuation_jobs(groups, points)
        conts = []
        if jobs:
            rep.start("continuations", len(jobs) * continuations)
            conts = collector.collect([{**todo[points[g].episode], "prefix": turn_prefix(first, points[g].turn)}
                                       for g, _, first in jobs for _ in range(continuations)], temperature=temp,
                                      generator=gen, progress=rep.advance)
        pairs, seeds, more = averaged_pairs(groups, points, jobs, conts, continuations, min_gap)
        return pairs, seeds, cfg, {**stats, "states": float(len(points)),
                                   "mismatched": float(len(points) * (k + 1) - sum(map(len, groups))),
                                   **more}
    pairs, seeds = [], []
    stats |= {"states": float(len(points)), "mismatched": 0.0}
    for n, pt in enumerate(points):  # one point at a time, to know each pair's task
        got, st = branch_pairs(episodes, [pt], branches[n * k : (n + 1) * k], k)
        pairs += got
        seeds += [episodes[pt.episode].seed] * len(got)
        stats["mismatched"] += st["critic/branch_mismatched"]
    return pairs, seeds, cfg, stats


def replayed_group(orig: Episode, branches: list[Episode], t: int) -> list[Episode]:
    """The episode and those of its branches that replayed its first ``t`` turns."""
    return [orig, *(br for br in branches if replayed(orig, br, t))]


def _by_action(group: list[Episode], t: int) -> dict[tuple[int, ...], list[Episode]]:
    """The attempts of one state, by their turn-``t`` action (first-seen order)."""
    out: dict[tuple[int, ...], list[Episode]] = {}
    for ep in group:
        out.setdefault(tuple(ep.turns[t].action_ids), []).append(ep)
    return out


def continuation_jobs(groups: list[list[Episode]], points: list[BranchPoint]) -> list[
        tuple[int, tuple[int, ...], Episode]]:
    """``(group, action, first attempt)`` for every distinct turn that did not end its episode; its continuations
    replay the first attempt's actions up to and including the turn (:func:`turn_prefix`). A turn that ended the
    episode has its return already."""
    jobs = []
    for g, (group, pt) in enumerate(zip(groups, points)):
        for action, eps in _by_action(group, pt.turn).items():
            if len(eps[0].turns) > pt.turn + 1:
                jobs.append((g, action, eps[0]))
    return jobs


def turn_prefix(ep: Episode, t: int) -> list[list[int]]:
    """The action ids of ``ep``'s turns ``0..t``: what a continuation from the state after turn ``t`` replays."""
    return [list(turn.action_ids) for turn in ep.turns[: t + 1]]


def averaged_pairs(groups: list[list[Episode]], points: list[BranchPoint], jobs: list, conts: list[Episode],
                   m: int, min_gap: float) -> tuple[list[TurnPair], list[int], dict[str, float]]:
    """Turn pairs labelled by each turn's mean return: its attempts' returns and its ``m`` continuations' (those
    that replayed its prefix) in ``conts`` (``m`` per job, in job order). Two turns pair when their means differ
    by more than ``min_gap``. Also: how often two attempts' one-continuation label disagrees with their turns'
    averaged one (ties in the means count as disagreeing), and the mean number of returns behind a turn."""
    extra: dict[tuple[int, tuple[int, ...]], list[float]] = {}
    for j, (g, action, first) in enumerate(jobs):
        extra[(g, action)] = [c.episode_return for c in conts[j * m : (j + 1) * m]
                              if replayed(first, c, points[g].turn + 1)]
    pairs: list[TurnPair] = []
    seeds: list[int] = []
    flipped = compared = samples = turns = 0
    for g, (group, pt) in enumerate(zip(groups, points)):
        cands = _by_action(group, pt.turn)
        mean = {}
        for action, eps in cands.items():
            rets = [ep.episode_return for ep in eps] + extra.get((g, action), [])
            mean[action] = sum(rets) / len(rets)
            samples += len(rets)
            turns += 1
        acts = list(cands)
        for a in range(len(acts)):
            for b in range(a + 1, len(acts)):
                x, y = acts[a], acts[b]
                for ex in cands[x]:  # the one-continuation labels these two turns had
                    for ey in cands[y]:
                        if ex.episode_return != ey.episode_return:
                            compared += 1
                            flipped += (ex.episode_return > ey.episode_return) != (mean[x] > mean[y]) or (
                                mean[x] == mean[y])
                if abs(mean[x] - mean[y]) <= min_gap:
                    continue
                better, worse = (x, y) if mean[x] > mean[y] else (y, x)
                pairs.append((state_input(cands[better][0], pt.turn), state_input(cands[worse][0], pt.turn)))
                seeds.append(group[0].seed)
    stats = {"returns_per_turn": samples / max(1, turns), "single_label_flipped": flipped / max(1, compared),
             "continuations_dropped": float(len(conts) - sum(map(len, extra.values())))}
    return pairs, seeds, stats


def split_by_task(pairs: list[TurnPair], seeds: list[int], held_out: float, seed: int) -> tuple[list, list]:
    """Training and held-out pairs, no task in both (held_out: the share of tasks held out)."""
    tasks = sorted(set(seeds))
    random.Random(seed).shuffle(tasks)
    test = set(tasks[: max(1, round(held_out * len(tasks)))])
    return ([p for p, s in zip(pairs, seeds) if s not in test], [p for p, s in zip(pairs, seeds) if s in test])


def critic_overrides(spec: str) -> dict[str, object]:
    """``key=value,key=value`` -> a dict of ``critic`` fields (values parsed as ``--set`` parses them)."""
    try:
        return dict(parse_overrides([item for item in spec.split(",") if item]))
    except ConfigError as e:
        raise SystemExit(f"--critic: {e}") from None


def critic_config(name: str, cfg: TrainConfig, overrides: dict[str, object]) -> CriticConfig:
    """The checkpoint's critic section with ``overrides`` and ``kind: action``, validated (a clear exit if not)."""
    try:
        return CriticConfig.model_validate({**cfg.critic.model_dump(), "kind": "action", **overrides})
    except ValueError as e:
        raise SystemExit(f"--critic {name}: {e}") from None


def demo_records(actor_run: Path, pairs: list[TurnPair]) -> list[dict]:
    """The actor run's demonstrations (``demos.jsonl`` beside its checkpoint), as the RL runs' scratch critics
    train their tokenizer on; else the pairs' text as records."""
    for d in (actor_run, actor_run.parent):
        if (d / "demos.jsonl").is_file():
            return read_jsonl(d / "demos.jsonl")
    return [{"privileged": b.privileged, "turns": [{"observation": o, "action": a} for a, o in b.history]
             + [{"observation": b.task, "action": b.action}]} for b, _ in pairs]


def train_one(name: str, overrides: dict[str, object], cfg: TrainConfig, actor_run: Path, train: list[TurnPair],
              test: list[TurnPair], *, epochs: int, precision: str, seed: int, train_acc: bool,
              rep: RichReporter) -> list[dict[str, float]]:
    """Train one critic on ``train``; held-out accuracy before and after each pass."""
    c_cfg = cfg.model_copy(update={"critic": critic_config(name, cfg, overrides)})
    torch.manual_seed(seed)
    demos = demo_records(actor_run, train)  # what a scratch critic trains its tokenizer on
    learner = build_critic(c_cfg, demos, None, None)  # type: ignore[arg-type] - the actor is read only by shared
    assert isinstance(learner, ActionLearner)
    learner.rng = random.Random(seed)
    learner.to(Runtime.from_config("cpu", precision))
    # Training accuracy on a sample as large as the held-out set (train_acc off: not measured, to save time).
    seen = random.Random(seed).sample(train, min(len(train), len(test))) if train_acc else []
    rows = [{"epoch": 0, "held_out_acc": learner.turn_pair_accuracy(test),
             "train_acc": learner.turn_pair_accuracy(seen) if seen else float("nan")}]
    print(f"{name}: {c_cfg.critic.encoder} (reads the privileged text: {learner.critic.include_privileged}); "
          f"held-out {rows[0]['held_out_acc']:.3f}, training {rows[0]['train_acc']:.3f} before training", flush=True)
    for e in range(1, epochs + 1):
        t0 = time.perf_counter()
        rep.start(f"{name} pass {e}", len(train))
        losses = learner.train_turn_pairs(train, epochs=1, progress=rep.advance)
        wall = time.perf_counter() - t0
        row = {"epoch": e, "loss": sum(losses) / len(losses), "held_out_acc": learner.turn_pair_accuracy(test),
               "train_acc": learner.turn_pair_accuracy(seen) if seen else float("nan"), "min": wall / 60}
        rows.append(row)
        print(f"{name}: pass {e}: loss {row['loss']:.3f}, held-out {row['held_out_acc']:.3f}, training "
              f"{row['train_acc']:.3f}, {row['min']:.1f} min", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actor", help="checkpoint whose actor plays the episodes and branches")
    p.add_argument("--critic", action="append", default=[], metavar="NAME=key=value,...",
                   help="a critic to train: overrides of the checkpoint's critic section (kind action implied)")
    p.add_argument("--tasks", type=int, default=None, help="episodes played (one per task; 512, --quick 24)")
    p.add_argument("--states", type=int, default=None, help="states branched from (512, --quick 24)")
    p.add_argument("--k", type=int, default=3, help="branches per state")
    p.add_argument("--continuations", type=int, default=0,
                   help="more plays of each distinct turn from the state after it; pairs by mean return (0: one each)")
    p.add_argument("--min-gap", type=float, default=0.0,
                   help="with --continuations: pair two turns only when their mean returns differ by more than this")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the config's)")
    p.add_argument("--held-out", type=float, default=0.3, help="share of tasks whose pairs are held out")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--pairs", default=None, help="cache of the played pairs (read if present, else written)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-acc", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure accuracy on a sample of the training pairs (costs as much as the held-out one)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a small BC actor trained here, a few states, tiny critics")
    p.add_argument("--quick-out", default="runs/critic_offline_quick", help="--quick: where its BC run goes")
    args = p.parse_args(argv)
    _quiet_libraries()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.actor = quick_actor(Path(args.quick_out))
        args.epochs, args.precision = 1, "fp32"
        args.critic = ["tiny+priv=encoder=scratch,hidden=32,layers=1,privileged=true",
                       "tiny=encoder=scratch,hidden=32,layers=1,privileged=false"]
    if args.tasks is None:
        args.tasks = 24 if args.quick else 512
    if args.states is None:
        args.states = 24 if args.quick else 512
    if args.continuations < 0 or args.min_gap < 0:
        p.error("--continuations and --min-gap must be >= 0")
    if not args.actor or not args.critic:
        p.error("give --actor and at least one --critic NAME=key=value,... (or --quick)")
    specs = {}
    for c in args.critic:
        name, sep, spec = c.partition("=")
        if not sep:
            p.error(f"--critic: expected NAME=key=value,..., got {c!r}")
        specs[name] = critic_overrides(spec)
    try:
        actor_cfg = resolve_policy(args.actor).config
    except (FileNotFoundError, ValueError) as e:
        p.error(f"--actor: {e}")
    if actor_cfg is None:
        p.error(f"--actor {args.actor}: expected a checkpoint saved by polyturn train")
    for name, ov in specs.items():  # a typo fails now, not after minutes of play
        critic_config(name, actor_cfg, ov)
    rep = RichReporter()  # progress on stderr: bars on a terminal, [progress] lines in a log
    cache = Path(args.pairs) if args.pairs else None
    play = {"tasks": args.tasks, "states": args.states, "k": args.k, "continuations": args.continuations,
            "min_gap": args.min_gap, "seed": args.seed}
    if cache is not None and cache.is_file():
        with cache.open("rb") as f:
            saved = pickle.load(f)
        if saved.get("play", play) != play:  # caches written before the settings were saved are taken as they are
            raise SystemExit(f"--pairs {cache} was played with {saved['play']}, not {play}: give another --pairs "
                             "path, or delete it to play again")
        pairs, seeds, stats = saved["pairs"], saved["seeds"], saved["stats"]
        cfg = actor_cfg
        print(f"{len(pairs)} turn pairs from {cache}")
    else:
        t0 = time.perf_counter()
        pairs, seeds, cfg, stats = play_pairs(args.actor, tasks=args.tasks, states=args.states, k=args.k,
                                              temperature=args.temperature, seed=args.seed, rep=rep,
                                              continuations=args.continuations, min_gap=args.min_gap)
        stats["play_min"] = (time.perf_counter() - t0) / 60
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            with cache.open("wb") as f:
                pickle.dump({"pairs": pairs, "seeds": seeds, "stats": stats, "play": play}, f)
    print("played: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items()))
    if not pairs:
        raise SystemExit("No turn pairs: every branch took the same action or ended with the same return")
    train, test = split_by_task(pairs, seeds, args.held_out, args.seed)
    if not train or not test:
        raise SystemExit(f"{len(pairs)} turn pairs from {len(set(seeds))} tasks: too few to hold some out "
                         "(play more --tasks and --states)")
    print(f"{len(train)} training pairs, {len(test)} held-out pairs (tasks split {1 - args.held_out:.0%} / "
          f"{args.held_out:.0%})", flush=True)
    results = {name: train_one(name, ov, cfg, Path(args.actor), train, test, epochs=args.epochs,
                               precision=args.precision, seed=args.seed, train_acc=args.train_acc, rep=rep)
               for name, ov in specs.items()}
    rep.close()
    print(f"\n| critic | held-out acc before | {' | '.join(f'after pass {e}' for e in range(1, args.epochs + 1))} "
          f"| training acc at the end (sample) | min per pass |")
    print("|---|---|" + "---|" * args.epochs + "---|---|")
    for name, rows in results.items():
        passes = " | ".join(f"{r['held_out_acc']:.3f}" for r in rows[1:])
        per = sum(r["min"] for r in rows[1:]) / max(1, len(rows) - 1)
        print(f"| {name} | {rows[0]['held_out_acc']:.3f} | {passes} | {rows[-1]['train_acc']:.3f} | {per:.1f} |")


def quick_actor(out: Path) -> str:
    """A Negotiation BC actor good enough to make some deals (the tiny config's actor, 128 demonstrations x 4
    epochs, ~30 s), trained once into ``out``; the tiny run of ``benchmarks/quick.py`` never makes a deal, so its
    branches never differ in return."""
    from polyturn.config import load_config
    from polyturn.train.trainer import Trainer

    if not (out / "ckpt-bc").is_dir():
        Trainer(load_config(Path(__file__).parents[1] / "configs" / "negotiation_tiny.yaml", [
            f"run.out_dir={out}", "bc.episodes=128", "bc.epochs=4", "bc.batch_episodes=16", "run.train_threads=1",
            "run.tensorboard=false", "run.eval_start=false", "env.eval_episodes=8", "curriculum.warmup_iters=0",
            "curriculum.mixed_iters=0", "curriculum.ppo_iters=0"]), overwrite=True).run()
    return str(out / "ckpt-bc")


if __name__ == "__main__":
    main()
