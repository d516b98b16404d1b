"""``polyturn play``: print episodes of a policy as readable transcripts."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rich.console import Console

from polyturn.acting.episodes import format_transcript, run_episode
from polyturn.acting.policies import make_text_policy
from polyturn.acting.registry import make_env, make_expert
from polyturn.acting.seats import seat
from polyturn.cli import play_server
from polyturn.envs.multi_agent import is_multi_agent


def run(args: argparse.Namespace) -> int:
    """Text policies run in :func:`polyturn.acting.episodes.run_episode`; a checkpoint's actor in the collector,
    greedily; ``--server``: a running server's agent in its environment sessions (:mod:`polyturn.cli.play_server`)."""
    if args.server is not None:
        return play_server.run(args)
    server_only = [f for f, v in (("--model", args.model), ("--files", args.files), ("--max-turns", args.max_turns),
                                  ("--quiet", args.quiet or None)) if v is not None]
    if server_only:
        raise ValueError(f"Expected {', '.join(server_only)} only with --server URL (episodes a running server plays)")
    args.env = args.env or "polyturn/SQLAnalyst-v0"
    args.policy = args.policy or "expert"
    env = make_env(args.env, args.env_kwargs)
    multi = is_multi_agent(env)
    if multi and args.policy in ("expert", "noisy"):
        env.close()
        raise ValueError(f"Expected a checkpoint or the random policy in a multi-role env, got {args.policy!r}: the "
                         "scripted experts play its single-agent form")
    if multi:  # one seat played, the others by a scripted training partner
        env = seat(env, args.env, role=args.role, partner=args.partner)
    elif args.role is not None or args.partner is not None:
        env.close()
        raise ValueError(f"Expected --role/--partner only with a multi-role env, got {args.env} with env kwargs "
                         f"{args.env_kwargs or {}}")
    try:
        if args.policy in ("expert", "noisy", "random"):
            if args.policy == "random":
                policy = make_text_policy("random", env, seed=args.seed)
            else:
                policy = make_expert(env, noise=args.noise if args.policy == "noisy" else 0.0, seed=args.seed)
            records = (run_episode(env, policy, seed=args.seed + k) for k in range(args.episodes))
        else:
            # Loading checkpoints pulls in transformers: the text policies above do without it.
            from polyturn.acting.checkpoint import load_checkpoint, run_actor

            torch.set_num_threads(1)
            ckpt = load_checkpoint(args.policy)
            eps = run_actor(ckpt.collector([env.unwrapped], env_id=args.env),
                            [{"seed": args.seed + k} for k in range(args.episodes)],
                            temperature=args.temperature, seed=args.seed, label=str(Path(args.policy)))
            records = (ep.to_record() for ep in eps)
        for record in records:
            Console().print(format_transcript(record), highlight=False)
    finally:
        env.close()
    return 0
