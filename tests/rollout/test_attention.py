"""The rollout engine's decode-step attention computes what transformers' SDPA path computes."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from polyturn.rollout import attention
from polyturn.rollout.attention import NAME, SharedPrefix, decode_attention, row_attention
from polyturn.rollout.generate import BatchDecoder


class _Heads(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
def test_row_attention_equals_sdpa_with_grouped_heads_and_masked_columns(heads, kv_heads):
    g = torch.Generator().manual_seed(0)
    b, w, d = 3, 9, 8
    q = torch.randn(b, heads, 1, d, generator=g)
    k = torch.randn(b, kv_heads, w, d, generator=g)
    v = torch.randn(b, kv_heads, w, d, generator=g)
    mask = torch.zeros(b, 1, 1, w, dtype=torch.bool)
    for i, n in enumerate([9, 4, 1]):  # rows read different numbers of columns; the rest hold other data
        mask[i, ..., :n] = True
    module = _Heads(heads // kv_heads)
    ours, _ = row_attention(module, q, k, v, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert ours.shape == ref.shape == (b, 1, heads, d)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    # Row 2 reads only column 0: its output is value column 0 of each head's key/value head.
    for h in range(heads):
        torch.testing.assert_close(ours[2, 0, h], v[2, h // (heads // kv_heads), 0])


def test_a_shared_prefix_read_once_gives_the_same_attention():
    g = torch.Generator().manual_seed(2)
    b, heads, kv_heads, p, w, d = 4, 6, 2, 5, 11, 8
    pk, pv = torch.randn(1, kv_heads, p, d, generator=g), torch.randn(1, kv_heads, p, d, generator=g)
    k = torch.randn(b, kv_heads, w, d, generator=g)
    v = torch.randn(b, kv_heads, w, d, generator=g)
    k[:, :, :p], v[:, :, :p] = pk, pv  # every row's first columns hold the prefix
    q = torch.randn(b, heads, 1, d, generator=g)
    mask = torch.zeros(b, 1, 1, w, dtype=torch.bool)
    for i, n in enumerate([11, 7, 6, 9]):
        mask[i, ..., :n] = True
    module = _Heads(heads // kv_heads)
    module.layer_idx = 1
    plain, _ = row_attention(module, q, k, v, mask)
    model = torch.nn.Module()
    model.config = LlamaConfig()
    model.config._attn_implementation = "sdpa"
    with decode_attention(model, SharedPrefix([(pk, pv)] * 2)):
        cascade, _ = row_attention(module, q, k, v, mask)
    torch.testing.assert_close(cascade, plain, atol=1e-5, rtol=1e-5)
    k[:, :, :p] = 0  # the cascade reads the prefix from SharedPrefix, not from the rows' columns
    with decode_attention(model, SharedPrefix([(pk, pv)] * 2)):
        torch.testing.assert_close(row_attention(module, q, k, v, mask)[0], plain, atol=1e-5, rtol=1e-5)
    # Sliced: the keys and values handed over hold only the columns after the prefix (the mask every column) ...
    with decode_attention(model, SharedPrefix([(pk, pv)] * 2, sliced=True)):
        torch.testing.assert_close(row_attention(module, q, k[:, :, p:], v[:, :, p:], mask)[0], plain,
                                   atol=1e-5, rtol=1e-5)
        # ... and a call that cannot take the cascade (here an additive mask) gets the prefix's columns put back.
        additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(row_attention(module, q, k[:, :, p:], v[:, :, p:], additive)[0], plain,
                                   atol=1e-5, rtol=1e-5)


def test_blocks_of_several_tokens_go_to_sdpa(monkeypatch):
    calls = []

    def counted(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return sdpa_attention_forward(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", counted)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 3, 4, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    ours, _ = row_attention(_Heads(1), q, k, v, mask)
    torch.testing.assert_close(ours, sdpa_attention_forward(_Heads(1), q, k, v, mask)[0])
    row_attention(_Heads(1), q[:, :, :1], k, v, mask[:, :, :1])  # one new token: the batched products
    assert calls == [3]


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (6, 1)])
def test_a_block_under_grouped_heads_reads_each_key_value_head_once_and_equals_sdpa(heads, kv_heads, monkeypatch):
    """Prefill blocks of a grouped-query model: the query heads of a key/value head folded into one head of
    g * n queries (no repeat_kv copy), the same attention as transformers' SDPA path, padded queries too."""
    g = torch.Generator().manual_seed(3)
    b, n, w, d = 3, 4, 10, 8
    q = torch.randn(b, heads, n, d, generator=g)
    k = torch.randn(b, kv_heads, w, d, generator=g)
    v = torch.randn(b, kv_heads, w, d, generator=g)
    mask = torch.zeros(b, 1, n, w, dtype=torch.bool)
    for i, start in enumerate([6, 3, 0]):  # row i's block sits at columns start.., causal within itself
        mask[i, 0, :, :start] = True
        mask[i, 0, :, start:start + n] = torch.ones(n, n, dtype=torch.bool).tril()
    module = _Heads(heads // kv_heads)
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.4)
    calls = []
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **kw: calls.append(1))
    ours, _ = row_attention(module, q, k, v, mask, scaling=0.4)
    assert calls == [] and ours.shape == ref.shape == (b, n, heads, d)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_the_decoder_switches_attention_only_inside_its_forward_passes(tiny_actor, monkeypatch):
    model = tiny_actor.model.eval()
    assert model.config._attn_implementation == "sdpa"
    calls = []
    real = attention.row_attention

    def counted(*args, **kwargs):
        calls.append(args[1].shape[2])
        return real(*args, **kwargs)

    monkeypatch.setitem(attention.AttentionInterface._global_mapping, NAME, counted)
    dec = BatchDecoder(model, pad_id=tiny_actor.pad_id, stop_id=tiny_actor.stop_id)
    dec._fast = False  # the model's own forward (a Llama body otherwise runs rollout/body.py, which calls it directly)
    dec.reset([tiny_actor.encode("<|user|>a task<|end|>\n<|assistant|>")] * 2)
    dec.sample(active=[True, True], temperature=1.0, max_new_tokens=4, generator=torch.Generator().manual_seed(0))
    assert 1 in calls  # decode steps ran through it
    assert model.config._attn_implementation == "sdpa"  # restored for training forward passes
    with pytest.raises(RuntimeError), decode_attention(model):
        assert model.config._attn_implementation == NAME
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"


def test_bf16_keys_in_a_wider_buffer_are_read_from_a_contiguous_copy_with_the_same_result():
    from polyturn.rollout.attention import _dense

    g = torch.Generator().manual_seed(3)
    b, heads, kv_heads, w, cap, d = 3, 6, 2, 9, 16, 8
    kbuf = torch.randn(b, kv_heads, cap, d, generator=g).bfloat16()
    vbuf = torch.randn(b, kv_heads, cap, d, generator=g).bfloat16()
    k, v = kbuf[:, :, :w], vbuf[:, :, :w]  # the cache's view of its first w columns
    assert not k.is_contiguous() and _dense(k).is_contiguous() and torch.equal(_dense(k), k)
    f32 = kbuf.float()[:, :, :w]
    assert _dense(f32) is f32  # float32 products read the view as it is
    q = torch.randn(b, heads, 1, d, generator=g).bfloat16()
    mask = torch.zeros(b, 1, 1, w, dtype=torch.bool)
    for i, n in enumerate([9, 5, 2]):
        mask[i, ..., :n] = True
    module = _Heads(heads // kv_heads)
    ours, _ = row_attention(module, q, k, v, mask)
    ref, _ = row_attention(module, q, k.contiguous(), v, mask)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, ref)
    sdpa, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask)
    torch.testing.assert_close(ours.float(), sdpa, atol=0.05, rtol=0.05)
