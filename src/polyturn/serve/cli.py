"""``polyturn serve``: the subcommand's arguments and entry (imports FastAPI only when run)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``polyturn serve`` on the CLI's subparsers."""
    s = sub.add_parser("serve", help="serve checkpoints over an OpenAI-compatible HTTP API (docs/serving.md)")
    s.add_argument("--checkpoint", action="append", required=True, metavar="DIR",
                   help="a checkpoint (or run) directory; repeat for A/B versions (the first takes all traffic)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--record", default=None, metavar="DIR", help="write finished sessions to DIR/sessions.jsonl")
    s.add_argument("--session-timeout", type=float, default=300.0, metavar="S", help="idle seconds before expiry")
    s.add_argument("--max-sessions", type=int, default=64, help="live sessions (cache rows) per version")
    s.add_argument("--data-dir", default=None, help="the only directory environment sessions may open files from")
    s.add_argument("--checkpoint-dir", action="append", default=None, metavar="DIR",
                   help="directories versions may be loaded from at run time (default: the checkpoints' parents)")
    s.add_argument("--admin-token-file", default=None,
                   help="file holding the admin bearer token (else env POLYTURN_ADMIN_TOKEN; none: admin off)")
    s.add_argument("--max-body-bytes", type=int, default=1_000_000)
    s.add_argument("--max-message-chars", type=int, default=8000)
    s.add_argument("--explore-epsilon", type=float, default=0.0, help="exploration in production (0 = off)")
    s.add_argument("--explore-candidates", type=int, default=4)
    s.add_argument("--explore-min-logprob", type=float, default=-1.0,
                   help="confidence filter: candidates below this mean token log-prob are dropped")
    s.add_argument("--explore-min-value", type=float, default=None,
                   help="with a critic in the checkpoint: explore only states whose value V(s) is at least this")
    s.add_argument("--explore-oracle-critic", action="store_true",
                   help="allow --explore-min-value with a critic that reads privileged text (an oracle experiment)")
    s.add_argument("--unbatched", action="store_true",
                   help="serve one request at a time, each session with its own single-row cache (a baseline)")
    s.add_argument("--prefill-chunk", type=int, default=64,
                   help="most context tokens a session feeds per decode step (a long tool result is prefilled in "
                        "chunks beside the other sessions' decoding); 0: all at once")
    s.add_argument("--device", default="auto", help="where the actors run: auto (the GPU when there is one), cpu, "
                   "cuda, cuda:N or mps")
    s.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"),
                   help="the forward passes' precision (fp32, the default, gives the evaluations' numbers)")
    s.add_argument("--merge-lora", action="store_true",
                   help="fold a LoRA actor's adapters into its base weights (fewer kernels a step; on the CPU it "
                   "measured no faster, docs/serving.md)")
    s.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: fastest for small models on a shared CPU; raise for large ones)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the server (blocks until interrupted)."""
    from polyturn.acting.policies import resolve_policy

    for c in args.checkpoint:
        if not Path(c).is_dir():
            raise FileNotFoundError(f"--checkpoint: expected a checkpoint directory, got {c!r}, which does not exist")
        resolve_policy(c)  # a directory without a checkpoint is the user's mistake: one line now, not at startup
    if not 0 < args.port < 65536:
        raise ValueError(f"--port: expected 1..65535, got {args.port}")
    import logging

    import torch
    import uvicorn

    from polyturn.serve.app import create_app
    from polyturn.serve.explore import ExploreSettings
    from polyturn.serve.service import ServeConfig

    token = None
    if args.admin_token_file:
        token = Path(args.admin_token_file).read_text().strip()
    if args.threads < 1:
        raise ValueError(f"--threads: expected >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    cfg = ServeConfig(
        checkpoints=list(args.checkpoint), record_dir=args.record, session_timeout_s=args.session_timeout,
        max_sessions=args.max_sessions, data_dir=args.data_dir, checkpoint_dirs=args.checkpoint_dir or [],
        admin_token=token, unbatched=args.unbatched, prefill_chunk=args.prefill_chunk,
        max_body_bytes=args.max_body_bytes,
        max_message_chars=args.max_message_chars, device=args.device, precision=args.precision,
        merge_lora=args.merge_lora,
        explore=ExploreSettings(epsilon=args.explore_epsilon, candidates=args.explore_candidates,
                                min_mean_logprob=args.explore_min_logprob, min_value=args.explore_min_value,
                                oracle_critic=args.explore_oracle_critic),
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("polyturn.serve").warning(
            "binding %s: the API is reachable from other machines; put it behind TLS and an auth proxy", args.host)
    uvicorn.run(create_app(cfg), host=args.host, port=args.port, log_level="info")
    return 0
