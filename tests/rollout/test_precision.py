"""Devices and precision: rollout log-probs agree with training log-probs under bf16 autocast (on CPU)."""

from __future__ import annotations

import os

import gymnasium as gym
import pytest
import torch

from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings
from polyturn.runtime import Runtime, resolve_device
from polyturn.train.batch import make_token_batch, policy_output

# Rollout (incremental, KV cache) and training (one full forward) compute the same log-probs in different
# shapes; in bf16 (8 bits of mantissa) the two differ by rounding. Measured on the demo's BC actor (32
# episodes, 1,464 action tokens): mean |diff| 2.7e-4, 99th percentile 3.7e-3, max 0.059 nats, so PPO's
# first ratios exp(diff) sit well inside the clip range 0.2 (docs/ARCHITECTURE.md, "Devices and precision").
BF16_MEAN_TOL = 0.03
BF16_MAX_TOL = 0.25
DEVICE = torch.device(os.environ.get("POLYTURN_TEST_DEVICE", "cpu"))  # benchmarks/gpu_check.sh sets cuda


def _collect_and_score(actor, precision: str):
    actor.to(Runtime(device=DEVICE, precision=precision))
    envs = [gym.make("polyturn/SQLAnalyst-v0", disable_env_checker=True, render_plots=False).unwrapped
            for _ in range(3)]
    col = Collector(actor, envs, env_id="polyturn/SQLAnalyst-v0",
                    settings=RolloutSettings(max_action_tokens=16, context_budget=2048))
    actor.model.eval()
    eps = col.collect([{"seed": s} for s in range(4)], temperature=1.0,
                      generator=torch.Generator(device=DEVICE).manual_seed(0))
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=actor.pad_id,
                             device=DEVICE)
    with torch.no_grad():
        lp = policy_output(actor, batch).logprobs
    m = batch.action_mask.bool()
    return (lp[m] - batch.old_logprobs[m]).abs()


def test_fp32_rollout_and_training_logprobs_agree(tiny_actor):
    diff = _collect_and_score(tiny_actor, "fp32")
    # TF32 matmuls on a GPU would be looser; polyturn leaves torch's default (fp32 matmuls stay fp32).
    assert diff.numel() > 20 and float(diff.max()) < 1e-4


def test_bf16_rollout_and_training_logprobs_agree_within_tolerance(tiny_actor):
    diff = _collect_and_score(tiny_actor, "bf16")
    assert diff.numel() > 20
    assert float(diff.mean()) < BF16_MEAN_TOL and float(diff.max()) < BF16_MAX_TOL
    assert float(diff.max()) > 0  # really computed in bf16 (fp32 agrees to ~1e-6)


def test_bf16_forward_computes_in_bf16_with_fp32_weights(tiny_actor):
    tiny_actor.to(Runtime(device=DEVICE))
    ids = torch.tensor([[5, 6, 7, 8, 9]], device=DEVICE)
    with torch.no_grad():
        ref = tiny_actor.hidden_states(ids, torch.ones_like(ids))
        actor = tiny_actor.to(Runtime(device=DEVICE, precision="bf16"))
        low = actor.hidden_states(ids, torch.ones_like(ids))
    assert 0 < float((low - ref).abs().max()) < 0.2 * float(ref.abs().max())
    assert next(actor.model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_device_resolution_and_errors():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="run.device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda:0")
    with pytest.raises(ValueError, match="fp16 is not supported on the CPU"):
        Runtime.from_config("cpu", "fp16")
    rt = Runtime.from_config("cpu", "bf16")
    assert rt.dtype == torch.bfloat16 and rt.grad_scaler() is None


def test_a_frozen_lora_base_is_stored_in_bf16_and_computes_what_autocast_computed(tiny_actor):
    from polyturn.models.actor import apply_lora

    tiny_actor.model = apply_lora(tiny_actor.model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj",
                                                                                               "up_proj"])
    actor = tiny_actor.to(Runtime(device=DEVICE))
    base = actor._base()
    with torch.no_grad():  # adapters start as a no-op (B = 0): give them a part in the output
        for name, p in actor.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]], device=DEVICE)
    bf16 = Runtime(device=DEVICE, precision="bf16")
    actor.runtime = bf16  # autocast over float32 weights, cast at every call
    ref = actor.head(actor.hidden_states(ids, torch.ones_like(ids))).float()
    actor.to(bf16)
    q = base.model.layers[0].self_attn.q_proj
    assert q.base_layer.weight.dtype == torch.bfloat16  # frozen base: stored in the compute dtype
    assert q.lora_A["default"].weight.dtype == torch.float32  # trained: float32 master weights
    assert base.get_input_embeddings().weight.dtype == torch.float32  # the residual stream stays float32
    assert base.model.layers[0].self_attn.k_proj.weight.dtype == torch.bfloat16  # untouched by LoRA, frozen
    out = actor.head(actor.hidden_states(ids, torch.ones_like(ids))).float()
    assert torch.equal(out, ref)  # exactly what the per-call cast computed
    out.logsumexp(-1).sum().backward()
    grads = [p.grad for p in actor.trainable_parameters()]
    assert grads and all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    actor.to(Runtime(device=DEVICE))  # back to fp32: every weight float32 again
    assert {p.dtype for p in actor.model.parameters()} == {torch.float32}


def test_under_bf16_the_rollout_cache_keeps_keys_in_bf16_and_decodes_the_same_tokens(tiny_actor, monkeypatch):
    """Keys leave the rotary embedding in float32; the cache stores them in bf16, as the products read them."""
    from polyturn.rollout import kv_cache
    from polyturn.rollout.generate import BatchDecoder

    actor = tiny_actor.to(Runtime(device=DEVICE, precision="bf16"))
    actor.model.eval()
    contexts = [[5, 6, 7, 8, 9, 10], [5, 6, 7], [11, 12, 13, 14]]

    def decode():
        dec = BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id, autocast=actor.autocast)
        dec.reset(contexts)
        acts = dec.sample(active=[True] * 3, temperature=1.0, max_new_tokens=6,
                          generator=torch.Generator(device=DEVICE).manual_seed(0))
        dec.append([[20, 21, 22], [23], [24, 25]])
        return dec, acts, dec.last_logits

    dec, acts, logits = decode()
    assert {(layer._k.dtype, layer._v.dtype) for layer in dec.cache.layers} == {(torch.bfloat16, torch.bfloat16)}
    monkeypatch.setattr(kv_cache, "_stored_dtype", lambda states: states.dtype)  # keys kept as they come
    ref_dec, ref_acts, ref_logits = decode()
    assert ref_dec.cache.layers[0]._k.dtype == torch.float32  # so the comparison is with float32 keys
    assert [a.ids for a in acts] == [a.ids for a in ref_acts]
    assert [a.logprobs for a in acts] == [a.logprobs for a in ref_acts]
    assert torch.equal(logits, ref_logits)  # autocast rounded the keys to bf16 before the products either way
    actor.to(Runtime(device=DEVICE))  # fp32: the cache keeps float32
    fp32_dec, _, _ = decode()
    assert fp32_dec.cache.layers[0]._k.dtype == torch.float32


@pytest.mark.parametrize("capability, emulated", [("AVX2", True), ("DEFAULT", True), ("AVX512", False)])
def test_bf16_on_a_cpu_without_avx512_is_flagged_as_emulated(monkeypatch, capability, emulated):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert Runtime(device=torch.device("cpu"), precision="bf16").emulated_bf16 is emulated
    assert not Runtime(device=torch.device("cpu"), precision="fp32").emulated_bf16
