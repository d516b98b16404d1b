"""``polyturn serve``: serve checkpoints over an OpenAI-compatible HTTP API (docs/serving.md)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from polyturn.runtime import resolve_device

if TYPE_CHECKING:
    from polyturn.serve.ope_gate import OPEGateSettings

# The server's modules (transformers, FastAPI, the serve package: ~7 s of imports on a 2-core CPU) load in run(),
# after the flags a user can get wrong are checked: `--device cuda` on a machine without one fails in ~2 s.


def ope_settings(args: argparse.Namespace) -> OPEGateSettings | None:
    """The ramp's off-policy gate from the ``--ope-*`` flags; None without ``--ope-margin`` (no gate)."""
    from polyturn.serve.ope_gate import OPEGateSettings

    if args.ope_margin is None:
        return None
    return OPEGateSettings(margin=args.ope_margin, metric=args.ope_metric, estimator=args.ope_estimator,
                           clip=args.ope_clip, confidence=args.ope_confidence, min_sessions=args.ope_min_sessions,
                           max_sessions=args.ope_max_sessions, data=list(args.ope_data))


def run(args: argparse.Namespace) -> int:
    """Start the server (blocks until interrupted)."""
    resolve_device(args.device, "--device")  # a device this machine lacks: one line before any checkpoint loads
    import torch
    import uvicorn

    from polyturn.acting.policies import resolve_policy
    from polyturn.serve.app import create_app
    from polyturn.serve.explore import ExploreSettings
    from polyturn.serve.hierarchy import check_versions
    from polyturn.serve.service import ServeConfig, Service, check_engine

    specs = []
    for c in args.checkpoint:
        if not Path(c).is_dir():
            raise FileNotFoundError(f"--checkpoint: expected a checkpoint directory, got {c!r}, which does not exist")
        specs.append(resolve_policy(c))  # a directory without a checkpoint: one line now, not at startup
    check_versions(specs)  # hierarchical checkpoints: both policies there, and no flat version beside them
    for c, spec in zip(args.checkpoint, specs):
        check_engine(spec.config, args.engine, c)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port: expected 1..65535, got {args.port}")
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
        merge_lora=args.merge_lora, engine=args.engine, vllm_python=args.vllm_python, threads=args.threads,
        ope=ope_settings(args),
        explore=ExploreSettings(epsilon=args.explore_epsilon, candidates=args.explore_candidates,
                                min_mean_logprob=args.explore_min_logprob, min_value=args.explore_min_value,
                                oracle_critic=args.explore_oracle_critic),
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("polyturn.serve").warning(
            "binding %s: the API is reachable from other machines; put it behind TLS and an auth proxy", args.host)
    service = Service(cfg)
    if cfg.engine == "vllm":  # started before the app, so a server that cannot start is a one-line error here
        try:
            for path in cfg.checkpoints:
                service.load_version(path)
        except BaseException:
            service.shutdown()
            raise
    uvicorn.run(create_app(cfg, service=service), host=args.host, port=args.port, log_level="info")
    return 0
