"""The pretrained path: a local HF model with LoRA adapters, as configs/sql_smollm2.yaml trains SmolLM2.

A small random Llama saved with ``save_pretrained`` (fixture ``local_model``) stands in for the
pretrained model, so these tests run in seconds.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyturn.models.actor import apply_lora, load_actor
from polyturn.train.batch import make_token_batch, policy_output
from polyturn.train.logger import read_metrics
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


def _logprobs(actor, batch) -> torch.Tensor:
    with torch.no_grad():
        actor.model.eval()
        return policy_output(actor, batch).logprobs


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, make_cfg, local_model):
    """BC then one PPO iteration with a KL penalty, LoRA on the local model; checkpoints every iteration."""
    out = tmp_path_factory.mktemp("lora_run")
    extra = ("curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "ppo.kl_coef=0.5", "env.eval_episodes=2",
             "actor.lr=3e-3", "actor.warmup_steps=0")
    tr = Trainer(_lora_cfg(make_cfg, out, local_model, "curriculum.ppo_iters=1", *extra))
    tr.run()
    batch = make_token_batch([(i, s) for i, segs in enumerate(tr.policy.demos[:4]) for s in segs],
                             pad_id=tr.actor.pad_id)
    return {"out": out, "trainer": tr, "batch": batch, "extra": extra}


def test_lora_checkpoint_saved_loaded_and_resumed_gives_identical_logprobs(lora_run, make_cfg, local_model):
    out, tr, batch = lora_run["out"], lora_run["trainer"], lora_run["batch"]
    final = out / "ckpt-final"
    assert (final / "actor" / "adapter_model.safetensors").is_file()
    assert not (final / "actor" / "model.safetensors").exists()  # the adapter only, not the base weights
    trained = _logprobs(tr.actor, batch)
    assert torch.equal(_logprobs(load_actor(final / "actor"), batch), trained)
    resumed = Trainer(_lora_cfg(make_cfg, out, local_model, "curriculum.ppo_iters=1", *lora_run["extra"]),
                      resume=True)
    assert resumed.actor.is_lora and resumed.state.iter == 1
    assert torch.equal(_logprobs(resumed.actor, batch), trained)


def test_kl_reference_is_the_bc_policy_saved_and_restored_on_resume(lora_run, make_cfg, local_model):
    out, batch = lora_run["out"], lora_run["batch"]
    bc = _logprobs(load_actor(out / "ckpt-bc" / "actor"), batch)
    for name in ("ckpt-bc", "ckpt-iter0001", "ckpt-final"):  # every checkpoint keeps the reference, adapter only
        assert (out / name / "ref_actor" / "adapter_model.safetensors").is_file(), name
        assert not (out / name / "ref_actor" / "model.safetensors").exists()
    assert torch.equal(_logprobs(load_actor(out / "ckpt-final" / "ref_actor"), batch), bc)
    tr = Trainer(_lora_cfg(make_cfg, out, local_model, "curriculum.ppo_iters=2", *lora_run["extra"]), resume=True)
    rl = _logprobs(tr.actor, batch)
    assert not torch.allclose(rl, bc, atol=1e-4)  # RL moved the actor away from BC
    tr.run()  # one more PPO iteration with the KL penalty, on the restored reference
    assert tr.policy.ref_actor is not None
    assert torch.equal(_logprobs(tr.policy.ref_actor, batch), bc)
    ppo = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "ppo"]
    assert [r["iter"] for r in ppo] == [0, 1]
    # The KL term is on and in the loss: after an RL update the policy is away from the reference.
    kl = ppo[1]["losses/kl_ref"]
    assert kl > 0
    assert ppo[1]["losses/actor_loss"] == pytest.approx(ppo[1]["losses/policy_loss"] + 0.5 * kl, rel=1e-4, abs=1e-6)


def test_lora_wrap_and_load_print_no_deprecation_warning(lora_run, local_model, recwarn):
    """peft's read of ``is_gradient_checkpointing`` made transformers warn at the start of every LoRA run."""
    warnings.simplefilter("always")
    apply_lora(AutoModelForCausalLM.from_pretrained(local_model), r=4, alpha=8, dropout=0.0, target_modules=["q_proj"])
    load_actor(lora_run["out"] / "ckpt-final" / "actor")
    assert [str(w.message) for w in recwarn if issubclass(w.category, FutureWarning)] == []


def test_a_lora_checkpoint_of_a_base_without_config_json_saves_without_a_warning(lora_run, tmp_path, recwarn):
    """SmolLM2 comes from a GGUF package with no config.json; peft's "auto" check warned at every checkpoint."""
    actor = lora_run["trainer"].actor
    pkg = tmp_path / "gguf_package"
    pkg.mkdir()
    config = actor.model.peft_config["default"]
    before = config.base_model_name_or_path
    config.base_model_name_or_path = str(pkg)
    try:
        warnings.simplefilter("always")
        actor.save_pretrained(tmp_path / "actor")
    finally:
        config.base_model_name_or_path = before
    assert [str(w.message) for w in recwarn if "config file" in str(w.message)] == []
    saved = load_actor(tmp_path / "actor")  # the adapter alone, no embedding weights, loads back
    assert saved.is_lora
