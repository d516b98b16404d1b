"""``actor.shared_prefix``: the prefix every row of a batch shares (a system prompt) runs once, as one row whose keys
and values the others read from a cache. In float64 its hidden states and log-probs are the one-pass forward's to
1e-9, its gradients to 1e-6 of their size (RMSNorm's float32); the marking leaves short or lone prefixes alone;
the micro-batch budget counts the prefix once."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from polyturn.models.actor import apply_lora, tiny_actor
from polyturn.rollout.types import Segment
from polyturn.train.batch import MIN_SHARED_PREFIX, common_prefix, make_token_batch, micro_batches, policy_output

PREFIX = 40


def _segments(vocab: int, tails: tuple[int, ...], prefix: int = PREFIX) -> list[Segment]:
    g = torch.Generator().manual_seed(0)
    head = torch.randint(0, vocab, (prefix,), generator=g).tolist()
    out = []
    for n in tails:
        seg = Segment()
        seg.add_context(head)
        tail = torch.randint(0, vocab, (n,), generator=g).tolist()
        seg.add_context(tail[:1])
        seg.add_action(tail[1:], [0.0] * (n - 1), turn=0)
        out.append(seg)
    return out


def _grads(actor, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    params = actor.trainable_parameters()
    for p in params:
        p.grad = None
    lp = policy_output(actor, batch).logprobs
    (lp * batch.action_mask).sum().backward()
    return lp.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("arch, kv_heads, lora", [("llama", None, False), ("qwen2", 2, False), ("llama", 2, True)])
def test_the_shared_prefix_pass_is_the_one_pass_forward(tiny_tokenizer, arch, kv_heads, lora):
    actor = tiny_actor(tiny_tokenizer, arch=arch, hidden=32, layers=2, heads=4, kv_heads=kv_heads, seed=0)
    if lora:
        model = apply_lora(actor.model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"])
        for name, p in model.named_parameters():  # LoRA's B starts at 0: move it, so its gradients are not trivial
            if "lora_B" in name:
                p.data.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
        actor = dataclasses.replace(actor, model=model, meta={**actor.meta, "lora": True})
    actor.model.double()
    segs = _segments(actor.model.config.vocab_size, (9, 25, 3))  # right-padded to 40 + 25
    plain = make_token_batch(list(enumerate(segs)), pad_id=actor.pad_id)
    shared = make_token_batch(list(enumerate(segs)), pad_id=actor.pad_id, share_prefix=True)
    assert plain.shared == 0 and shared.shared == PREFIX
    with torch.no_grad():
        h0 = actor.hidden_states(plain.input_ids, plain.attention_mask)
        h1 = actor.hidden_states(shared.input_ids, shared.attention_mask, prefix=shared.shared)
    real = plain.attention_mask.bool()
    assert torch.allclose(h0[real], h1[real], rtol=0, atol=1e-9)
    lp0, g0 = _grads(actor, plain)
    lp1, g1 = _grads(actor, shared)
    assert torch.allclose(lp0, lp1, rtol=0, atol=1e-9)
    assert len(g0) == len(g1) > 0
    for a, b in zip(g0, g1, strict=True):
        # to float32 rounding: transformers' RMSNorm computes in float32 even in a float64 model
        assert a.abs().max() > 0 and (a - b).abs().max() <= 1e-6 * a.abs().max()


def test_only_a_prefix_of_min_shared_prefix_tokens_in_several_rows_is_marked(tiny_actor):
    vocab = tiny_actor.model.config.vocab_size
    short = _segments(vocab, (5, 7), prefix=MIN_SHARED_PREFIX - 2)
    assert make_token_batch(list(enumerate(short)), pad_id=0, share_prefix=True).shared == 0
    lone = _segments(vocab, (5,))
    assert make_token_batch([(0, lone[0])], pad_id=0, share_prefix=True).shared == 0
    # The common prefix leaves every row a token after it.
    assert common_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2 and common_prefix([[1, 2], [1, 3]]) == 1
    assert common_prefix([[5, 6]]) == 0


def test_the_micro_batch_budget_counts_a_shared_prefix_once():
    rows = [[100], [100], [100]]
    assert micro_batches(rows, 150) == [[0], [1], [2]]
    assert micro_batches(rows, 150, prefix=80) == [[0, 1, 2]]  # 80 + 3 x 20 tokens
    assert micro_batches(rows, 130, prefix=80) == [[0, 1], [2]]  # 80 + 2 x 20; a lone row costs all its 100
    assert micro_batches([[200], [10]], 150, prefix=80) == [[0], [1]]  # a row over the budget alone


def test_under_gradient_checkpointing_the_prefix_is_ignored_not_dropped(tiny_actor):
    segs = _segments(tiny_actor.model.config.vocab_size, (6, 9))
    batch = make_token_batch(list(enumerate(segs)), pad_id=tiny_actor.pad_id, share_prefix=True)
    assert batch.shared == PREFIX
    tiny_actor.model.train()
    before = tiny_actor.hidden_states(batch.input_ids, batch.attention_mask).detach()
    tiny_actor.enable_gradient_checkpointing()
    after = tiny_actor.hidden_states(batch.input_ids, batch.attention_mask, prefix=batch.shared).detach()
    assert torch.equal(before, after)  # the one-pass forward: checkpointing would drop the prefix's cache


def test_shared_prefix_with_gradient_checkpointing_is_refused_with_the_fix():
    from polyturn.config import ActorConfig

    with pytest.raises(ValueError, match="set one of them false"):
        ActorConfig(shared_prefix=True, gradient_checkpointing=True)
