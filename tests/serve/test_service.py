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


def test_a_lora_actor_is_merged_on_request_and_always_for_vllm(tmp_path, tiny_actor):
    """vLLM's CPU build served a LoRA checkpoint 3.3x faster merged (docs/vllm.md): ``--engine vllm`` hosts the
    folded weights; the home engine keeps the adapters unless ``--merge-lora``."""
    import sys
    from types import SimpleNamespace

    from polyturn.models.actor import ACTOR_META, pretrained_actor
    from polyturn.serve.service import ServeConfig, Service

    tiny_actor.save_pretrained(tmp_path / "base")
    (tmp_path / "base" / ACTOR_META).unlink()  # a plain local HF model, as a LoRA run's base
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    pretrained_actor("local", path=str(tmp_path / "base"), lora=lora).save_pretrained(tmp_path / "actor")
    loaded = {}
    kinds = {"home": {}, "home merged": {"merge_lora": True}, "vllm": {"engine": "vllm", "vllm_python": sys.executable}}
    for name, kw in kinds.items():
        cfg = ServeConfig(checkpoints=[str(tmp_path)], device="cpu", **kw)
        loaded[name] = Service._load_actor(SimpleNamespace(config=cfg), tmp_path / "actor").is_lora
    assert loaded == {"home": True, "home merged": False, "vllm": False}
