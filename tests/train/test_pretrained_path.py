"""The pretrained path: a local HF model with LoRA adapters, as configs/sql_smollm2.yaml trains SmolLM2.

A small random Llama saved with ``save_pretrained`` (fixture ``local_model``) stands in for the
pretrained model, so these tests run in seconds.
"""

from __future__ import annotations

import torch

from polyturn.train.batch import make_token_batch, policy_output
from polyturn.train.trainer import Trainer

LORA = "actor.lora={r: 4, alpha: 8, dropout: 0.5, target_modules: [q_proj, v_proj]}"


def _lora_cfg(make_cfg, out, local_model, *extra):
    return make_cfg(out, "actor.preset=local", f"actor.path={local_model}", LORA, *extra)


def _train_adapters(actor, std: float = 1.0) -> None:
    """Give LoRA B a trained-looking value (peft starts it at 0, where adapter dropout has no effect)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in actor.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def test_dropout_leaves_the_first_ppo_ratio_at_one(tmp_path, make_cfg, local_model):
    cfg = _lora_cfg(make_cfg, tmp_path, local_model, "curriculum.warmup_iters=0", "curriculum.mixed_iters=0",
                    "curriculum.ppo_iters=1", "ppo.epochs=1", "ppo.minibatch_episodes=8",
                    "ppo.episodes_per_iter=8", "curriculum.epsilon.start=0.0", "curriculum.epsilon.end=0.0")
    tr = Trainer(cfg)
    assert tr.actor.is_lora
    _train_adapters(tr.actor)
    m = tr.rl_iteration(0)  # one minibatch: the first of the first epoch, before any update
    assert m["losses/clipfrac"] == 0.0
    assert abs(m["losses/approx_kl"]) < 1e-5
