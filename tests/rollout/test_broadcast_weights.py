"""What a Ray broadcast carries (rollout/workers.py, no Ray needed): a LoRA actor's adapters only, enough to
make a worker's copy compute the learner's logits."""

from __future__ import annotations

import copy

import torch

from polyturn.models.actor import apply_lora
from polyturn.rollout.workers import trainable_weights


def test_a_lora_actor_broadcasts_its_adapters_alone_and_they_suffice(tiny_actor):
    tiny_actor.model = apply_lora(tiny_actor.model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    worker = copy.deepcopy(tiny_actor.model)  # the worker's copy, as sent at start-up
    with torch.no_grad():  # the learner's update: adapters move (lora_B starts at 0, so the output changes)
        for name, p in tiny_actor.model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    sent = trainable_weights(tiny_actor)
    assert sent and all("lora_" in k for k in sent)  # no frozen base weight travels
    total = sum(p.numel() for p in tiny_actor.model.parameters())
    assert sum(t.numel() for t in sent.values()) < 0.2 * total
    x = torch.randint(0, tiny_actor.tokenizer.vocab_size, (2, 12))
    with torch.no_grad():
        assert not torch.allclose(worker(input_ids=x).logits, tiny_actor.model(input_ids=x).logits)
        worker.load_state_dict(sent, strict=False)  # as RolloutWorker installs a broadcast
        torch.testing.assert_close(worker(input_ids=x).logits, tiny_actor.model(input_ids=x).logits)
