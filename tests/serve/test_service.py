"""The service's configuration: where its actors run."""

from __future__ import annotations

import pytest
import torch


def test_serve_config_puts_the_actors_on_its_runtime(checkpoints):
    from polyturn.serve.service import ServeConfig, Service

    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], device="cpu", precision="fp32")
    assert cfg.runtime.device == torch.device("cpu")
    with pytest.raises(ValueError, match="--precision: expected fp32, bf16 or fp16"):
        ServeConfig(checkpoints=[str(checkpoints[0])], precision="fp64")
    service = Service(cfg)
    try:
        v = service.load_version(checkpoints[0], name="a")
        assert v.actor.runtime == cfg.runtime and v.actor.device == torch.device("cpu")
        assert v.engine.generator.device == v.actor.device
    finally:
        service.shutdown()
