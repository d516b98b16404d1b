"""Actor presets: tiny models save as standard HF directories whose tokenizer loads back exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from polyturn.models.actor import load_actor, tiny_actor
from polyturn.models.chat import SIMPLE_SPECIAL_TOKENS
from polyturn.models.tokenizer import train_tokenizer

TEXTS = ["Today is 2024-11-10. Which 3 products had the highest revenue in North China?",
         "Action: run_sql[{\"sql\": \"SELECT zone FROM sales WHERE zone = 'East China'\"}]"] * 30


@pytest.mark.parametrize("arch, kv_heads", [("llama", None), ("qwen2", None), ("llama", 2)])
def test_tiny_actor_round_trip(tmp_path, arch, kv_heads):
    tok = train_tokenizer(TEXTS, vocab_size=400, special_tokens=SIMPLE_SPECIAL_TOKENS, split_words=False,
                          max_token_length=24)
    actor = tiny_actor(tok, arch=arch, hidden=32, layers=1, heads=4, kv_heads=kv_heads)
    assert actor.model.config.num_key_value_heads == (kv_heads or 4)
    assert 1e4 < actor.num_parameters() < 1e7
    actor.save_pretrained(tmp_path)
    back = load_actor(tmp_path)
    probe = TEXTS[0] + "<|end|>\n<|tool|>" + TEXTS[1]
    assert back.tokenizer.encode(probe, add_special_tokens=False) == actor.encode(probe)
    assert back.stop_id == actor.stop_id and back.chat == actor.chat
    ids = torch.tensor([actor.encode(probe)])
    with torch.no_grad():
        assert torch.allclose(back.model(input_ids=ids).logits, actor.model(input_ids=ids).logits)
    # Plain transformers users load the same model; for llama the same tokenizer too.
    AutoModelForCausalLM.from_pretrained(tmp_path)
    if arch == "llama":
        assert AutoTokenizer.from_pretrained(tmp_path).encode(probe, add_special_tokens=False) == actor.encode(probe)


def test_merge_lora_folds_the_adapters_into_the_base_and_keeps_the_function(tiny_actor):
    from polyturn.models.actor import apply_lora
    from polyturn.runtime import Runtime

    assert tiny_actor.merge_lora() is tiny_actor  # no adapters: left as it is
    tiny_actor.model = apply_lora(tiny_actor.model, r=4, alpha=8, dropout=0.0,
                                  target_modules=["q_proj", "v_proj", "up_proj"])
    tiny_actor.meta = {**tiny_actor.meta, "lora": {"r": 4}}
    torch.manual_seed(0)
    for name, p in tiny_actor.model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0, where merging changes nothing: give the adapters a function
            p.data.normal_(0, 0.2)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.no_grad():
        before = tiny_actor.model(input_ids=ids).logits
        n_lora = sum("lora_" in n for n, _ in tiny_actor.model.named_parameters())
        tiny_actor.merge_lora()
        after = tiny_actor.model(input_ids=ids).logits
    assert n_lora > 0 and not any("lora_" in n for n, _ in tiny_actor.model.named_parameters())
    assert not tiny_actor.is_lora and not any(p.requires_grad for p in tiny_actor.model.parameters())
    assert torch.allclose(before, after, atol=1e-5) and before.abs().max() > 0
    tiny_actor.to(Runtime(device=torch.device("cpu"), precision="bf16"))  # merged weights are frozen: stored bf16
    assert tiny_actor.model.get_decoder().layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
