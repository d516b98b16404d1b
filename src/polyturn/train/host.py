"""What the Ray collection (:mod:`polyturn.train.remote`) reads of the trainer that drives it.

Typed against this protocol, it does not import the trainer module that imports it (the dependency runs one way:
trainer -> remote -> this module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from polyturn.config import TrainConfig
from polyturn.models.actor import Actor
from polyturn.rollout.context import RolloutSettings
from polyturn.train.state import RunState


class TrainerHost(Protocol):
    """The trainer's attributes and steps the rollout workers' side uses."""

    cfg: TrainConfig
    settings: RolloutSettings
    state: RunState
    rng: np.random.Generator
    out: Path  #: the run directory (each rollout worker's vLLM server keeps its files under ``out/vllm``)

    @property
    def actor(self) -> Actor: ...

    @property
    def rl_total(self) -> int: ...

    def next_tasks(self, n: int, progress: float) -> list[dict]: ...
