"""The trainer's vLLM engine: a :class:`VLLMServer` that always samples with the actor's current weights.

:meth:`VLLMEngine.sync`, called by the collector before every collection, pushes the actor's weights when they
changed since the last push:

* a LoRA actor's adapters are saved and loaded by the server at run time (``/v1/load_lora_adapter``, with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); requests then name the new adapter, and the old one is unloaded;
* a full actor's weights are saved over the served directory and reloaded in place by the engine's worker
  (``reload_weights`` through ``/collective_rpc``, a development endpoint: ``VLLM_SERVER_DEV_MODE``), then the
  prefix cache, which holds keys and values of the old weights, is reset.

A LoRA actor is served from its base model's directory (SmolLM2's float32 copy, or ``actor.path``); a full actor
from a copy of its weights under the run's ``vllm/`` directory.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from polyturn.models.actor import Actor, smollm2_cache_dir
from polyturn.rollout.vllm_server import SERVED_NAME, VLLMServer

logger = logging.getLogger(__name__)

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _fingerprint(actor: Actor) -> tuple[float, ...]:
    """A cheap summary of the trainable weights (sums): it changes when an update changes them."""
    with torch.no_grad():
        return tuple(float(p.detach().float().sum()) for p in actor.trainable_parameters())


class VLLMEngine:
    """A vLLM server for ``actor``, kept on its current weights (``rollout.engine = vllm``).

    ``workdir`` holds the pushed weights and the server's log (``server.log``); ``python`` is vLLM's
    environment; ``precision`` the run's (``fp32``, ``bf16``), which vLLM computes in; ``max_model_len`` at
    least the context budget plus an action. :meth:`start` starts the server (minutes on a CPU). It runs
    without chunked prefill, so that seeded requests (a collection's draws, a served request's ``seed``) work.
    """

    def __init__(self, actor: Actor, workdir: str | Path, *, python: str | Path = ".venv-vllm/bin/python",
                 precision: str = "fp32", max_model_len: int = 2048, threads: int = 1, compile: bool = False) -> None:
        self.workdir = Path(workdir)
        self.lora = actor.is_lora
        self.version = 0
        self.restarts = 0
        self._pushed: tuple[float, ...] | None = None
        if self.lora:
            base = (smollm2_cache_dir() if actor.meta.get("preset") == "smollm2-135m" else actor.meta.get("path"))
            if not base or not (Path(base) / "config.json").is_file():
                raise ValueError(f"Expected a LoRA actor on a base model directory (smollm2-135m, or actor.path) for "
                                 f"the vLLM engine, got preset {actor.meta.get('preset')!r}")
            model_dir = Path(base)
            rank = max(c.r for c in actor.model.peft_config.values())
        else:
            model_dir = self.workdir / "weights"
            rank = 16
            self._save_full(actor, model_dir)
            self._pushed = _fingerprint(actor)
        self.server = VLLMServer(model_dir, python=python, dtype=DTYPES[precision], max_model_len=max_model_len,
                                 threads=threads, compile=compile, enable_lora=self.lora,
                                 max_lora_rank=min(r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= rank),
                                 log_path=self.workdir / "server.log", dev_mode=not self.lora, chunked_prefill=False)

    @staticmethod
    def _save_full(actor: Actor, directory: Path) -> None:
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        actor.save_pretrained(tmp)
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)

    def start(self) -> VLLMEngine:
        self.server.start()
        return self

    def restart(self) -> None:
        """Start the server again after it died (the collector then plays its tasks again): a full actor's
        directory holds the weights last pushed; a LoRA actor's adapters are pushed again at the next sync."""
        self.server.close()
        self.restarts += 1
        logger.warning("the vLLM server died (its log: %s); starting it again", self.server.log_path)
        if self.lora:
            self._pushed, self.server.served = None, SERVED_NAME
        self.server.start()

    def sync(self, actor: Actor) -> bool:
        """Push ``actor``'s weights if they changed since the last push; returns whether it pushed."""
        now = _fingerprint(actor)
        if now == self._pushed:
            return False
        self.version += 1
        if self.lora:
            name, directory = f"actor-v{self.version}", self.workdir / f"adapter-v{self.version}"
            actor.model.save_pretrained(directory)
            self.server.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(directory)})
            old, self.server.served = self.server.served, name
            if old != SERVED_NAME:
                self.server.post("/v1/unload_lora_adapter", {"lora_name": old})
                shutil.rmtree(self.workdir / f"adapter-v{self.version - 1}", ignore_errors=True)
        else:
            self._save_full(actor, self.server.model_dir)
            self.server.post("/collective_rpc", {"method": "reload_weights",
                                                 "kwargs": {"weights_path": str(self.server.model_dir)}})
            self.server.post("/reset_prefix_cache", {})
        self._pushed = now
        return True

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> VLLMEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
