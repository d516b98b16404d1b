"""``actor.preset: local`` trains any HF causal-LM directory with its own chat template, through LoRA."""

from __future__ import annotations

import json

import pytest
import torch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, demos):
    """A small random Qwen2 saved with ``save_pretrained``, its tokenizer carrying a ChatML chat template."""
    import gymnasium as gym
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from polyturn.acting.jsonl import read_jsonl
    from polyturn.models.tokenizer import train_tokenizer
    from polyturn.train.setup import corpus

    d = tmp_path_factory.mktemp("qwen2_chatml")
    tool_docs = gym.make("polyturn/SQLAnalyst-v0").unwrapped.tool_docs()
    tok = train_tokenizer(corpus(read_jsonl(demos), privileged=False) + [tool_docs], vocab_size=1024,
                          special_tokens=("<|im_start|>", "<|im_end|>"), split_words=False, max_token_length=24)
    tok.chat_template = CHATML
    tok.eos_token = "<|im_end|>"
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.slow
# The test's own PeftModel.from_pretrained (a user without polyturn) reads the property transformers deprecates.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_local_model_with_chat_template_trains_with_lora(tmp_path, make_cfg, qwen2_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from polyturn.train.trainer import Trainer

    lora = "actor.lora={r: 4, alpha: 8, dropout: 0.05, target_modules: [q_proj, v_proj]}"
    cfg = make_cfg(tmp_path, "actor.preset=local", f"actor.path={qwen2_dir}", lora, "rollout.system_prompt=true",
                   "rollout.context_budget=4096", "rollout.max_action_tokens=160", "env.kwargs={max_turns: 3}",
                   "env.eval_episodes=4", "rollout.num_envs=4", "ppo.episodes_per_iter=4", "curriculum.warmup_iters=0",
                   "curriculum.mixed_iters=1", "curriculum.ppo_iters=1")
    trainer = Trainer(cfg)
    actor = trainer.actor
    assert actor.chat.kind == "template" and actor.is_lora
    assert actor.stop_id == actor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    # BC reads a demonstration in exactly the context the template renders (system prompt = tool docs).
    demo = trainer.demos[0]
    system = trainer.envs[0].unwrapped.tool_docs()
    messages = [{"role": "system", "content": system}, {"role": "user", "content": demo["turns"][0]["observation"]}]
    prompt = actor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    seg = trainer.policy.demos[0][0]
    prefix = actor.encode(prompt)
    assert seg.ids[: len(prefix)] == prefix and seg.action_mask[len(prefix)] == 1
    base_before = {k: v.clone() for k, v in actor._base().state_dict().items() if "lora" not in k}
    summary = trainer.run()
    assert set(summary["eval"]) == {"bc", "final"}
    # LoRA trained adapters only; the base weights are untouched.
    after = actor._base().state_dict()
    assert all(torch.equal(v, after[k]) for k, v in base_before.items())
    # The checkpoint is a peft adapter directory that transformers + peft load without polyturn.
    actor_dir = tmp_path / "ckpt-final" / "actor"
    assert json.loads((actor_dir / "adapter_config.json").read_text())["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(qwen2_dir)
    loaded = PeftModel.from_pretrained(base, actor_dir).eval()
    ids = torch.tensor([prefix[:50]])
    actor.model.eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, actor.model(input_ids=ids).logits, atol=1e-5)
    assert AutoTokenizer.from_pretrained(actor_dir).chat_template == CHATML
