"""``polyturn serve``'s settings (its flags), checked when made."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from polyturn.config import RolloutConfig

from polyturn.runtime import Runtime
from polyturn.serve.explore import ExploreSettings
from polyturn.serve.ope_gate import OPEGateSettings


@dataclass
class ServeConfig:
    """Server settings (the ``polyturn serve`` flags).

    ``unbatched`` serves one request at a time, each session with its own
    single-row cache (the baseline of ``benchmarks/serve_load.py``);
    ``prefill_chunk`` is :class:`~polyturn.serve.engine.Engine`'s.
    ``checkpoint_dirs`` are the only directories versions may be loaded from at
    run time (default: the parents of ``checkpoints``); ``data_dir`` the only
    one environment sessions may open databases and task files from.
    ``device`` / ``precision`` are where and how the actors run (``auto``: the
    GPU when there is one; fp32 gives the evaluations' numbers); ``merge_lora``
    folds a LoRA actor's adapters into its base weights (:meth:`Actor.merge_lora`), always with ``engine`` vllm
    (:attr:`merges_lora`).
    ``ope`` gates every ramp past 20% on an off-policy estimate (:mod:`polyturn.serve.ope_gate`).
    ``engine`` is what decodes: ``home`` (:class:`~polyturn.serve.engine.Engine`) or ``vllm``
    (:class:`~polyturn.serve.vllm_engine.VLLMServeEngine`: a vLLM server per version, started from
    ``vllm_python``, computing in ``precision`` on ``threads`` torch threads).
    """

    checkpoints: list[str]
    record_dir: str | None = None
    session_timeout_s: float = 300.0
    max_sessions: int = 64
    data_dir: str | None = None
    checkpoint_dirs: list[str] = field(default_factory=list)
    admin_token: str | None = None
    max_body_bytes: int = 1_000_000
    max_message_chars: int = 8000
    max_messages: int = 256
    explore: ExploreSettings = field(default_factory=ExploreSettings)
    batch_window_s: float = 0.002
    prefill_chunk: int = 64
    unbatched: bool = False
    seed: int = 0
    reap_every_s: float = 1.0
    device: str = "auto"
    precision: str = "fp32"
    merge_lora: bool = False
    ope: OPEGateSettings | None = None  # the ramp's off-policy gate (--ope-margin), off by default
    engine: Literal["home", "vllm"] = "home"
    vllm_python: str = RolloutConfig.model_fields["vllm_python"].default
    threads: int = 1
    runtime: Runtime = field(init=False, repr=False)  # resolved from device and precision

    @property
    def merges_lora(self) -> bool:
        """Whether a LoRA actor is served with its adapters folded in: on request, and always by vLLM, whose CPU
        build ran a SmolLM2 LoRA checkpoint's turns 3.3x faster merged than through its adapters (32 customer-service
        sessions, 2026-12-06, docs/vllm.md); the home engine measured no faster merged (docs/serving.md)."""
        return self.merge_lora or self.engine == "vllm"

    def __post_init__(self) -> None:
        if not self.checkpoints:
            raise ValueError("Expected at least one --checkpoint, got none")
        if self.admin_token is None:
            self.admin_token = os.environ.get("POLYTURN_ADMIN_TOKEN") or None
        if self.admin_token is not None and len(self.admin_token) < 16:
            raise ValueError("Expected an admin token of at least 16 characters (POLYTURN_ADMIN_TOKEN), "
                             f"got {len(self.admin_token)}")
        for name, value in (("--max-sessions", self.max_sessions), ("--max-body-bytes", self.max_body_bytes),
                            ("--max-message-chars", self.max_message_chars), ("--threads", self.threads)):
            if value < 1:
                raise ValueError(f"{name}: expected >= 1, got {value}")
        if self.prefill_chunk < 0:
            raise ValueError(f"--prefill-chunk: expected >= 0 (0: a turn's context in one pass), got {self.prefill_chunk}")
        for name, d in [("--data-dir", self.data_dir)] + [("--checkpoint-dir", c) for c in self.checkpoint_dirs]:
            if d is not None and not Path(d).is_dir():
                raise FileNotFoundError(f"{name}: expected a directory, got {d!r}, which is not one")
        if self.ope is not None and not self.record_dir and not self.ope.data:
            raise ValueError("--ope-margin: Expected recorded sessions of the incumbent to estimate a ramped version "
                             "on: pass --record DIR (this server's sessions) and/or --ope-data FILE")
        if self.engine not in ("home", "vllm"):
            raise ValueError(f"--engine: expected home or vllm, got {self.engine!r}")
        if self.engine == "vllm":
            self._check_vllm()
        if not self.checkpoint_dirs:
            self.checkpoint_dirs = sorted({str(Path(c).resolve().parent) for c in self.checkpoints})
        self.runtime = Runtime.from_config(self.device, self.precision,  # type: ignore[arg-type]
                                           names=("--device", "--precision"))

    def _check_vllm(self) -> None:
        """What ``--engine vllm`` needs: vLLM's environment, and none of the home engine's own features."""
        if not Path(self.vllm_python).is_file():
            raise FileNotFoundError(f"--vllm-python: expected vLLM's virtual environment's interpreter at "
                                    f"{self.vllm_python!r}, found none; run `make vllm-venv` to install it "
                                    "(docs/vllm.md), or pass --vllm-python PATH")
        if self.unbatched:
            raise ValueError("--unbatched: expected it only with --engine home (it is the home engine's "
                             "one-request-at-a-time baseline); vLLM batches concurrent requests itself")
        if self.explore.epsilon > 0:
            raise ValueError("--explore-epsilon: expected 0 with --engine vllm, got "
                             f"{self.explore.epsilon} (exploration's candidates are sampled and scored by the home "
                             "engine; not supported on vLLM yet): serve with --engine home to explore")
