"""``polyturn rate``: blind pairwise preference ratings of two evaluations, by a person on a web page or by a judge."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
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


def run(args: argparse.Namespace) -> int:
    """Serve the rating page until Ctrl-C, or rate with ``--judge heuristic | llm``; print the win rate."""
    console = Console(stderr=True)
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
