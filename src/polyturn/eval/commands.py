"""The evaluation subcommands of ``polyturn``: ``evaluate``, ``make-test-cases``, ``rate``, ``diagnose``.

``polyturn.cli`` calls :func:`add_commands` with its argparse subparsers;
each subcommand stores its handler as ``func(args) -> int`` (exit code).
User mistakes raise ``ValueError`` / ``FileNotFoundError`` with a message
that says what was expected; the CLI turns them into one-line errors.
The handlers are the one place here that draws to the terminal (rich).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from polyturn.argtypes import json_object, non_negative_float, non_negative_int, port_number, positive_int


def _console() -> Console:
    return Console(stderr=True)


def add_commands(subparsers: Any, *, critic_values: Callable[..., Any] | None = None) -> None:
    """Register ``evaluate``, ``make-test-cases``, ``rate`` and ``diagnose`` on an argparse subparsers object.

    ``critic_values`` is diagnose's critic evaluator (:data:`polyturn.eval.diagnose.CriticValues`), handed in by
    the ``polyturn`` command because evaluation never imports the trainer.
    """
    p = subparsers.add_parser("evaluate", help="Run policies on test cases and write a comparison report.",
                              description="Run checkpoints (and the built-in expert / random policies) on the same "
                                          "test cases; write episodes, metrics.json and report.md (+ report.html "
                                          "and figures with --visualize).")
    p.add_argument("--policy_checkpoint", "--policy-checkpoint", nargs="+", required=True, metavar="DIR",
                   help="checkpoint directories (ckpt-* holding actor/ and config.yaml), actor/ directories, "
                        "run directories (their latest checkpoint), or the names expert / random")
    p.add_argument("--test_cases", "--test-cases", required=True, metavar="FILE", help="JSON or JSONL test cases (see make-test-cases)")
    p.add_argument("--visualize", action="store_true", help="also draw figures and write report.html")
    p.add_argument("--out", default="eval_report", metavar="DIR", help="output directory (default: eval_report)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed for sampling, the random policy and bootstraps")
    p.add_argument("--num_envs", "--num-envs", type=positive_int, default=16, help="conversations an actor runs in one batch")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="policy name the differences are taken against (default: the first)")
    p.add_argument("--compare", nargs="+", default=None, metavar="NAME",
                   help="only compare these policies with the baseline (default: all)")
    p.add_argument("--embedder", choices=("minilm", "none"), default="minilm",
                   help="MiniLM embeddings for coherence and failure clusters, or none to skip both")
    p.add_argument("--best-of", "--best_of", type=positive_int, default=1, metavar="N",
                   help="sample N candidate turns per state and play the action critic's favourite (default 1: off)")
    p.add_argument("--critic", default=None, metavar="DIR",
                   help="with --best-of: the action critic (a checkpoint or its critic/ directory; default: each "
                        "checkpoint's own). It must not read privileged text unless --oracle")
    p.add_argument("--oracle", action="store_true",
                   help="with --best-of: allow a critic that reads privileged text; the rows are labelled oracle")
    p.set_defaults(func=cmd_evaluate)

    p = subparsers.add_parser("make-test-cases", help="Write a test-case file from a range of task seeds.")
    p.add_argument("--env", default="polyturn/SQLAnalyst-v0", help="env id")
    p.add_argument("--seeds", required=True, metavar="A:B", help="task seeds A..B-1 (use held-out seeds)")
    p.add_argument("--out", required=True, metavar="FILE", help="JSONL file to write")
    p.add_argument("--env_kwargs", "--env-kwargs", type=json_object, default=None, metavar="JSON",
                   help='gymnasium.make keyword arguments, e.g. \'{"max_turns": 6}\'')
    p.set_defaults(func=cmd_make_test_cases)

    p = subparsers.add_parser("rate", help="Blind pairwise preference ratings of two evaluations (web page or judge).")
    p.add_argument("--pairs", nargs=2, required=True, metavar=("A_DIR", "B_DIR"),
                   help="two evaluate output directories (one policy each) or episode JSONL files")
    p.add_argument("--port", type=port_number, default=8765, help="port on 127.0.0.1 (0 picks a free one)")
    p.add_argument("--out", default="ratings.jsonl", metavar="FILE", help="ratings JSONL (appended to)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the left/right order")
    p.add_argument("--judge", choices=("human", "heuristic", "llm"), default="human",
                   help="human: serve the rating page; heuristic: rate offline (success > fewer turns > fewer errors); "
                        "llm: ask an OpenAI-compatible chat model (--judge_model, --judge_url)")
    p.add_argument("--judge_model", "--judge-model", default=None, metavar="NAME", help="model name for --judge llm")
    p.add_argument("--judge_url", "--judge-url", default=None, metavar="URL",
                   help="OpenAI-compatible base URL for --judge llm (default $OPENAI_BASE_URL or "
                        "https://api.openai.com/v1; key from $OPENAI_API_KEY)")
    p.add_argument("--judge_timeout", "--judge-timeout", type=non_negative_float, default=60.0, metavar="S",
                   help="seconds one --judge llm call may take (default 60)")
    p.add_argument("--judge_retries", "--judge-retries", type=non_negative_int, default=2, metavar="N",
                   help="retries of a --judge llm call that timed out or got HTTP 408/409/429/5xx (default 2)")
    p.add_argument("--max_pairs", "--max-pairs", type=positive_int, default=None, help="rate at most this many pairs")
    p.set_defaults(func=cmd_rate)

    p = subparsers.add_parser("diagnose", help="Training curves, a critic check and warnings for a run.")
    p.add_argument("--run", required=True, metavar="DIR", help="run directory (holds metrics.jsonl)")
    p.add_argument("--checkpoint", default=None, metavar="NAME", help="checkpoint name (default: latest)")
    p.add_argument("--episodes", type=non_negative_int, default=16, help="held-out episodes for the critic check (0 skips it)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default: <run>/diagnose)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed of the validation episodes")
    p.set_defaults(func=cmd_diagnose, critic_values=critic_values)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``polyturn evaluate``."""
    from polyturn.acting.policies import resolve_policy
    from polyturn.console import RichReporter
    from polyturn.eval.runner import evaluate
    from polyturn.eval.testcases import load_test_cases

    console = _console()
    n_cases = len(load_test_cases(args.test_cases))
    for policy in args.policy_checkpoint:  # fail on a bad path before any work starts
        resolve_policy(policy)
    rep = RichReporter(console)
    rep.start("evaluate", n_cases * len(args.policy_checkpoint))
    try:
        data = evaluate(args.policy_checkpoint, args.test_cases, out_dir=args.out, visualize=args.visualize,
                        temperature=args.temperature, seed=args.seed, num_envs=args.num_envs, progress=rep.advance,
                        baseline=args.baseline, compare_to=args.compare,
                        embedder=None if args.embedder == "none" else "minilm", best_of=args.best_of,
                        critic=args.critic, oracle=args.oracle)
    finally:
        rep.close()
    for p in data.policies:
        v = data.values[p]["success_rate"]
        console.print(escape(f"{p}: success {v.value:.3f} [{v.lo:.3f}, {v.hi:.3f}] over {v.n} episodes"))
    out = Path(args.out)
    console.print(f"wrote {out / 'report.md'}" + (f" and {out / 'report.html'}" if args.visualize else ""))
    return 0


def cmd_make_test_cases(args: argparse.Namespace) -> int:
    """``polyturn make-test-cases``."""
    from polyturn.eval.testcases import make_test_cases

    cases = make_test_cases(args.env, args.seeds, args.out, env_kwargs=args.env_kwargs)
    _console().print(f"wrote {len(cases)} test cases to {args.out}")
    return 0


def cmd_rate(args: argparse.Namespace) -> int:
    """``polyturn rate``: serve the rating page until Ctrl-C, or rate with --judge heuristic | llm."""
    from rich.progress import track

    from polyturn.eval.preference import (
        chat_completion_judge,
        heuristic_verdict,
        judge_prompt,
        load_side,
        make_pairs,
        parse_verdict,
        win_rate,
    )
    from polyturn.eval.rate_server import RatingSession, make_server

    console = _console()
    (a_name, a), (b_name, b) = load_side(args.pairs[0]), load_side(args.pairs[1])
    if a_name == b_name:
        a_name, b_name = f"A:{a_name}", f"B:{b_name}"
    pairs = make_pairs(a, b, a_name=a_name, b_name=b_name, seed=args.seed)
    if args.max_pairs is not None:
        if args.max_pairs < 1:
            raise ValueError(f"Expected --max_pairs >= 1, got {args.max_pairs}")
        pairs = pairs[: args.max_pairs]
    if args.judge == "llm" and not args.judge_model:
        raise ValueError("Expected --judge_model NAME with --judge llm (the chat model the server serves)")
    rater = f"llm-judge:{args.judge_model}" if args.judge == "llm" else args.judge
    session = RatingSession(pairs, args.out, seed=args.seed, rater=rater)
    if args.judge != "human":
        todo = [p for p in pairs if p.index not in session.rated]
        if len(todo) < len(pairs):
            console.print(f"{len(pairs) - len(todo)} of {len(pairs)} pairs already judged in {args.out}; "
                          f"judging the other {len(todo)}")
        judge = (chat_completion_judge(args.judge_model, base_url=args.judge_url, timeout=args.judge_timeout,
                                       max_retries=args.judge_retries) if args.judge == "llm" else None)
        for pair in track(todo, description="judging", console=console, transient=True):
            if judge is None:
                session.rate(pair.index, heuristic_verdict(pair.left_record, pair.right_record))
            else:
                reply = judge(judge_prompt(pair))  # one pair at a time: a failure keeps the verdicts before it
                session.rate(pair.index, parse_verdict(reply), raw=reply)
        console.print(escape(win_rate(session.ratings()).summary()))
        return 0
    try:
        server = make_server(session, port=args.port)
    except OSError as e:
        raise ValueError(f"Expected a free port on 127.0.0.1, got {args.port} ({e.strerror}); "
                         "pass another --port (0 picks a free one)") from None
    host, port = server.server_address[:2]
    console.print(f"rating {len(pairs)} pairs ({a_name} vs {b_name}) at http://{host}:{port}/ "
                  f"- choices go to {args.out}; Ctrl-C to stop")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    console.print(escape(win_rate(session.ratings()).summary()))
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    """``polyturn diagnose``."""
    from polyturn.console import RichReporter
    from polyturn.eval.diagnose import diagnose, run_metrics

    run_metrics(Path(args.run))  # a wrong --run fails before the progress bar starts
    console = _console()
    rep = RichReporter(console)
    rep.start("validation episodes", args.episodes)
    try:
        res = diagnose(args.run, checkpoint=args.checkpoint, episodes=args.episodes, out_dir=args.out,
                       progress=rep.advance, seed=args.seed, critic_values=args.critic_values)
    finally:
        rep.close()
    from polyturn.eval.checks import format_warning

    for w in res.warnings:
        console.print(escape(format_warning(w, plot_dir=res.paths["dir"])), style="yellow", highlight=False)
    if not res.warnings:
        quiet = (f"no warning over {res.iterations} RL iterations: every check is within its noise threshold "
                 "(docs/evaluation.md)")
        console.print(quiet if res.iterations else "no RL iteration in metrics.jsonl yet: nothing to check")
    for c in res.held_out:
        console.print(escape(c.summary()), highlight=False)
    if res.critic is not None:
        console.print(escape(f"critic: MSE {res.critic.mse:.4g}, explained variance "
                             f"{res.critic.explained_variance_text()}"), highlight=False)
    console.print(f"wrote {res.paths['markdown']}")
    return 0
