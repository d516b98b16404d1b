"""One run.device and one run.precision for the whole run; checkpoints hold float32 CPU tensors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from polyturn.config import load_config
from polyturn.train.logger import read_metrics
from polyturn.train.trainer import NullReporter, Trainer

CFG = Path(__file__).parents[2] / "configs" / "test_tiny.yaml"
# benchmarks/gpu_check.sh runs these on a GPU with POLYTURN_TEST_DEVICE=cuda; everywhere else they run on the CPU.
DEVICE = os.environ.get("POLYTURN_TEST_DEVICE", "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_bf16_with_gradient_checkpointing_trains_every_phase(tmp_path, demos, critic):
    cfg = load_config(CFG, [f"run.out_dir={tmp_path}", f"bc.demos={demos}", f"run.device={DEVICE}", "run.precision=bf16",
                            "actor.gradient_checkpointing=true", "critic.gradient_checkpointing=true",
                            f"critic.kind={critic}", "ppo.kl_coef=0.05", "env.eval_episodes=2",
                            "env.kwargs={max_turns: 4}"])  # every phase; short episodes
    trainer = Trainer(cfg)
    assert trainer.runtime.precision == "bf16" and trainer.actor.device.type == DEVICE.split(":")[0]
    assert trainer.actor._base().is_activation_checkpointing
    summary = trainer.run()
    assert set(summary["eval"]) == {"bc", "final"}
    rl = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["phase"] in ("mixed", "ppo")]
    for r in rl:
        for key in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl", "grad/actor_norm"):
            assert torch.isfinite(torch.tensor(r[key])), (key, r[key])
    weights = load_file(str(tmp_path / "ckpt-final" / "actor" / "model.safetensors"))
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in weights.values())


def test_bad_device_is_a_config_error_naming_the_field(tmp_path, demos):
    with pytest.raises(ValueError, match="run.device"):
        Trainer(load_config(CFG, [f"run.out_dir={tmp_path}", f"bc.demos={demos}", "run.device=tpu"]))


def test_bf16_on_a_cpu_without_avx512_warns_to_use_fp32(tmp_path, demos, monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    said = []

    class Said(NullReporter):
        def message(self, text: str) -> None:
            said.append(text)

    cfg = [f"run.out_dir={tmp_path}", f"bc.demos={demos}", "run.device=cpu"]
    Trainer(load_config(CFG, [*cfg, "run.precision=bf16"]), reporter=Said())
    assert len(said) == 1 and "AVX2" in said[0] and "run.precision: fp32" in said[0]
    Trainer(load_config(CFG, [*cfg, "run.precision=fp32", f"run.out_dir={tmp_path}/fp32"]), reporter=Said())
    assert len(said) == 1


def test_rl_mode_has_no_dropout_but_keeps_gradient_checkpointing(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from polyturn.models.actor import Actor
    from polyturn.models.chat import chat_format_for

    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, attention_dropout=0.5))
    actor = Actor(model=model, tokenizer=tiny_tokenizer, chat=chat_format_for(tiny_tokenizer), meta={})
    actor.enable_gradient_checkpointing()
    actor.train_without_dropout()
    calls = []
    model.model.layers[0].self_attn.register_forward_hook(lambda *a: calls.append(1))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    h1 = actor.hidden_states(ids, torch.ones_like(ids))
    h2 = actor.hidden_states(ids, torch.ones_like(ids))
    assert torch.equal(h1, h2)  # attention dropout 0.5 would make these differ
    calls.clear()
    actor.hidden_states(ids, torch.ones_like(ids)).sum().backward()
    assert len(calls) == 2  # the layer ran again in backward: checkpointing is on
