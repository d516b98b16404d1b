"""The ``polyturn`` command: demos, play, train (and evaluate, make-test-cases, rate, diagnose).

User mistakes (a bad config value, a missing file, an unknown env id) end with
a one-line ``error:`` message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.console import Console

from polyturn.config import ConfigError

USER_ERRORS = (ConfigError, FileNotFoundError, ValueError, KeyError)


def _cmd_demos(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from polyturn.demos import generate_demos, write_jsonl

    kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("demonstrations", total=args.episodes)
        records = list(generate_demos(args.env, episodes=args.episodes, noise=args.noise, seed=args.seed,
                                      env_kwargs=kwargs, progress=lambda n: prog.advance(task, n)))
    n = write_jsonl(args.out, records)
    succ = sum(r["success"] for r in records) / max(1, len(records))
    Console().print(f"wrote {n} episodes to {args.out} (success rate {succ:.3f}, noise {args.noise})")
    return 0


def _cmd_play(args: argparse.Namespace) -> int:
    import gymnasium as gym
    import numpy as np

    import polyturn  # noqa: F401  (registers the environments)
    from polyturn.demos import format_transcript, run_episode

    kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    env = gym.make(args.env, disable_env_checker=True, **kwargs).unwrapped
    if args.policy in ("expert", "noisy"):
        from polyturn.envs.sql.expert import SQLExpert

        noise = args.noise if args.policy == "noisy" else 0.0
        policy = SQLExpert(env, noise=noise, seed=args.seed)
        for k in range(args.episodes):
            Console().print(format_transcript(run_episode(env, policy, seed=args.seed + k)), highlight=False)
        return 0
    if args.policy == "random":
        rng = np.random.default_rng(args.seed)

        class _Random:
            def reset(self, obs, info):
                pass

            def act(self, obs, info):
                return env.sample_valid_action(rng)

        for k in range(args.episodes):
            Console().print(format_transcript(run_episode(env, _Random(), seed=args.seed + k)), highlight=False)
        return 0
    # A checkpoint directory: run its actor greedily.
    from pathlib import Path

    import torch

    from polyturn.config import load_config
    from polyturn.models.actor import load_actor
    from polyturn.rollout.collector import Collector
    from polyturn.train.setup import rollout_settings

    ckpt = Path(args.policy)
    actor_dir = ckpt / "actor" if (ckpt / "actor").is_dir() else ckpt
    if not actor_dir.is_dir():
        raise FileNotFoundError(f"--policy: expected expert, noisy, random or a checkpoint directory, got {args.policy!r}")
    cfg_path = ckpt / "config.yaml"
    cfg = load_config(cfg_path if cfg_path.is_file() else None)
    torch.set_num_threads(1)
    actor = load_actor(actor_dir)
    col = Collector(actor, [env], env_id=args.env, settings=rollout_settings(cfg))
    eps = col.collect([{"seed": args.seed + k} for k in range(args.episodes)], temperature=args.temperature,
                      generator=torch.Generator().manual_seed(args.seed), policy=str(ckpt))
    for ep in eps:
        Console().print(format_transcript(ep.to_record()), highlight=False)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from polyturn.config import load_config
    from polyturn.console import RichReporter
    from polyturn.train.trainer import Trainer

    cfg = load_config(args.config, args.set or [])
    rep = RichReporter(every=args.log_every)
    try:
        summary = Trainer(cfg, reporter=rep, resume=args.resume).run()
    finally:
        rep.close()
    ev = summary["eval"]
    con = Console()
    if "bc" in ev and "final" in ev:
        con.print(f"held-out success ({ev['final']['episodes']} tasks): BC {ev['bc']['success_rate']:.3f} -> "
                  f"final {ev['final']['success_rate']:.3f}")
    con.print(f"run directory: {cfg.run.out_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyturn", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demos", help="write expert / noisy-expert demonstrations as JSONL")
    d.add_argument("--env", default="polyturn/SQLAnalyst-v0")
    d.add_argument("--env-kwargs", default=None, help="JSON object of gymnasium.make keyword arguments")
    d.add_argument("--episodes", type=int, default=1000)
    d.add_argument("--noise", type=float, default=0.0, help="noisy-expert error rate (0 = the expert)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", required=True)
    d.set_defaults(func=_cmd_demos)

    pl = sub.add_parser("play", help="print episodes of a policy as readable transcripts")
    pl.add_argument("--env", default="polyturn/SQLAnalyst-v0")
    pl.add_argument("--env-kwargs", default=None)
    pl.add_argument("--policy", default="expert", help="expert, noisy, random, or a checkpoint directory")
    pl.add_argument("--noise", type=float, default=0.3)
    pl.add_argument("--episodes", type=int, default=1)
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--temperature", type=float, default=0.0)
    pl.set_defaults(func=_cmd_play)

    t = sub.add_parser("train", help="BC -> critic warm-up -> mixed -> PPO from a YAML config")
    t.add_argument("--config", default=None, help="YAML config (see configs/)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. ppo.clip=0.1")
    t.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    t.add_argument("--log-every", type=int, default=1)
    t.set_defaults(func=_cmd_train)

    try:
        from polyturn.eval.commands import add_commands
    except ImportError:  # the evaluation toolkit is optional at import time
        add_commands = None
    if add_commands is not None:
        add_commands(sub)

    from polyturn.serve.cli import add_command as add_serve_command

    add_serve_command(sub)
    return p


def _quiet_libraries() -> None:
    """transformers draws its own progress bars when saving and loading; polyturn shows its own."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    if args.command in ("demos", "play"):
        for name in ("noise",):
            v = getattr(args, name, None)
            if v is not None and not 0.0 <= v <= 1.0:
                Console(stderr=True).print(f"error: --{name} must be in [0, 1], got {v}")
                return 2
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        Console(stderr=True).print(f"[red]error:[/red] {msg}", highlight=False)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
