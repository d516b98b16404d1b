"""``polyturn tournament``: a multi-role game's checkpoints against scripted partners and each other."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from polyturn.acting.checkpoint import LoadedCheckpoint, load_checkpoint
from polyturn.console import RichReporter
from polyturn.eval.tournament import Arena, against_partners, all_partners, head_to_head, write
from polyturn.models.actor import load_actor


def _pool(run: Path, like: LoadedCheckpoint) -> list[LoadedCheckpoint]:
    """A self-play run's pool entries (``RUN/pool/<entry>/<policy>``), each played with ``like``'s settings."""
    entries = sorted(p for p in (run / "pool").glob("*/*") if p.is_dir()) if (run / "pool").is_dir() else []
    if not entries:
        raise FileNotFoundError(f"Expected a self-play opponent pool in {run / 'pool'}, found none")
    out = []
    for path in entries:
        actor = load_actor(path).to(like.actor.runtime)
        actor.model.eval()
        out.append(LoadedCheckpoint(label=f"pool {path.parent.name}", actor_dir=path, actor=actor, config=like.config))
    return out


def run(args: argparse.Namespace) -> int:
    """Write ``--out``/tournament.md, tournament.json and head_to_head.png; print the report."""
    if not args.checkpoint and not args.pool:
        raise ValueError("Expected --checkpoint DIR (repeatable) or --pool RUN, got neither")
    given = args.checkpoint or [str(Path(args.pool))]
    ckpts = [load_checkpoint(c) for c in given]
    if len({c.label for c in ckpts}) < len(ckpts):  # e.g. two runs' ckpt-final: name them by the paths given
        for c, arg in zip(ckpts, given):
            c.label = str(Path(arg))
    cfg = ckpts[0].config
    arena = Arena(env_id=cfg.env.id, env_kwargs=args.env_kwargs if args.env_kwargs is not None else cfg.env.kwargs,
                  seed_start=cfg.env.eval_seed_start)
    partners, holdout = all_partners(cfg.env.id)
    if args.partner:
        unknown = sorted(set(args.partner) - set(partners))
        if unknown:
            raise ValueError(f"Expected --partner among {', '.join(sorted(partners))} ({cfg.env.id}), "
                             f"got {', '.join(unknown)}")
        partners = {name: partners[name] for name in args.partner}
    console = Console(stderr=True)
    rep = RichReporter(console)
    tables = {}
    for c in ckpts:
        rep.start(f"{c.label} against partners", len(partners) * len(arena.roles) * args.episodes)
        tables[c.label] = against_partners(c, arena, partners, episodes=args.episodes, temperature=args.temperature,
                                           seed=args.seed, progress=rep.advance)
    matched = ckpts + (_pool(Path(args.pool), ckpts[0]) if args.pool else [])
    labels = [c.label for c in matched]
    wins: list = [[None]]
    if len(matched) > 1:
        pairs = len(matched) * (len(matched) - 1) // 2
        rep.start("head to head", pairs * len(arena.roles) * args.matrix_episodes)
        wins = head_to_head(matched, arena, episodes=args.matrix_episodes, temperature=args.temperature,
                            seed=args.seed, progress=rep.advance)
    paths = write(Path(args.out), tables, holdout, labels, wins)
    Console(soft_wrap=True).print(escape(paths["markdown"].read_text()), highlight=False)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
