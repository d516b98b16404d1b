"""The rollout engine's own body forward (rollout/body.py) computes the model's forward bit for bit."""

from __future__ import annotations

import pytest
import torch

from polyturn.models.actor import apply_lora, build_tiny_model
from polyturn.rollout import body as fast_body
from polyturn.rollout.generate import BatchDecoder


def _drive(model, tok, fast: bool) -> list[torch.Tensor]:
    """One decoder's logits after each step of a session that takes every path: a shared system prompt read once
    (cascade attention), prefills of rows of different lengths (split in two passes), sampling with rows
    finishing, a restarted row reusing the prefix, and a step where only some rows run."""
    dec = BatchDecoder(model, pad_id=tok.pad_token_id, stop_id=tok.eos_token_id)
    dec._fast = fast
    system = list(range(5, 45))  # long enough to be shared (generate.MIN_SHARED_PREFIX)
    dec.reset([system + [50, 51], system + [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72], system + [80]])
    seen = [dec.last_logits.clone()]
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        dec.sample(active=[True, True, True], temperature=1.0, max_new_tokens=6, generator=gen)
        seen.append(dec.last_logits.clone())
        dec.append([[90, 91], [92], [93, 94, 95]])
        seen.append(dec.last_logits.clone())
    dec.restart_row(1)
    dec.append([[], system + [7, 8, 9], []])  # one row of three runs, from the shared prefix
    seen.append(dec.last_logits.clone())
    dec.sample(active=[False, True, False], temperature=1.0, max_new_tokens=4, generator=gen)
    seen.append(dec.last_logits.clone())
    return seen


@pytest.mark.parametrize("arch,kv_heads,lora", [("llama", 4, False), ("qwen2", 2, False), ("llama", 2, True)])
def test_the_body_forward_gives_the_models_own_logits_bit_for_bit(tiny_tokenizer, arch, kv_heads, lora):
    model = build_tiny_model(tiny_tokenizer, arch=arch, hidden=32, layers=2, heads=4, kv_heads=kv_heads, seed=0)
    if lora:  # adapters that change the output: B is zero at init
        model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    model.eval()
    dec = BatchDecoder(model, pad_id=tiny_tokenizer.pad_token_id, stop_id=tiny_tokenizer.eos_token_id)
    assert dec._fast  # Llama and Qwen2 bodies take it
    ours, theirs = _drive(model, tiny_tokenizer, True), _drive(model, tiny_tokenizer, False)
    assert len(ours) == len(theirs) == 7
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def test_bodies_it_does_not_compute_run_their_own_forward(tiny_tokenizer):
    qwen = build_tiny_model(tiny_tokenizer, arch="qwen2", hidden=32, layers=2, heads=4, seed=0)
    body = qwen.get_decoder()
    assert fast_body.supports(body)
    body.layers[1].self_attn.sliding_window = 16  # a sliding-window layer
    assert not fast_body.supports(body)
    assert not fast_body.supports(torch.nn.Linear(2, 2))
