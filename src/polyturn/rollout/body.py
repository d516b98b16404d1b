"""The transformer body's forward pass for the rollout engine, without transformers' per-call wrapping.

A decode step of a small model is bound by Python, not arithmetic: transformers' ``LlamaModel.forward`` wraps
each call in its output-capturing, kwarg-deprecation and config-defaults decorators, builds the causal mask
(returned as given for a 4D one), and every layer reads its config through ``__getattribute__`` hooks. For the
tiny test actor (1 layer, hidden 32, 8 rows) 0.6 of the body's 1.6 ms a decode step went outside its layers on the
AVX2 EPYC (cProfile of a ``configs/test_tiny.yaml`` run, 1,936 steps, 2026-12-07); the engine's collection is
1.17-1.19x faster for it (``benchmarks/rollout.py``). :func:`body_forward` runs the same modules in the same order
(each linear is still its module, so a LoRA adapter still applies), with the decode attention
(:func:`~polyturn.rollout.attention.row_attention`) called directly: the hidden states are bitwise those of the model's own forward under
:func:`~polyturn.rollout.attention.decode_attention` (tests/rollout/test_body.py).

Only bodies whose layers are exactly Llama's or Qwen2's (Llama, SmolLM2, Qwen2 without sliding windows) take
it (:func:`supports`); any other runs its own forward. Forward hooks on the body, its layers or their attention
modules do not run in the engine's passes (those on the embedding, the norms, the linears and the MLPs do);
training's forward passes are the model's own.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rotary
from transformers.models.qwen2.modeling_qwen2 import Qwen2Model
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb as qwen2_rotary

from polyturn.rollout import attention

_ROTARY = {LlamaModel: llama_rotary, Qwen2Model: qwen2_rotary}


def supports(body: nn.Module) -> bool:
    """Whether :func:`body_forward` computes ``body``'s own forward: a Llama or Qwen2 body (exactly those
    classes), every layer attending to all earlier columns (no sliding window)."""
    if type(body) not in _ROTARY:
        return False
    return all(getattr(layer.self_attn, "sliding_window", None) is None for layer in body.layers)


def body_forward(body: nn.Module, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 cache: nn.Module) -> torch.Tensor:
    """``body(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache).last_hidden_state`` for a body
    :func:`supports` accepts, with ``row_attention`` as its attention (inside ``decode_attention``)."""
    rotary = _ROTARY[type(body)]
    h = body.embed_tokens(ids)
    cos, sin = body.rotary_emb(h, position_ids=pos)
    shape = ids.shape
    for layer in body.layers[: body.config.num_hidden_layers]:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        split = (*shape, -1, attn.head_dim)
        q = attn.q_proj(x).view(split).transpose(1, 2)
        k = attn.k_proj(x).view(split).transpose(1, 2)
        v = attn.v_proj(x).view(split).transpose(1, 2)
        q, k = rotary(q, k, cos, sin)
        k, v = cache.update(k, v, attn.layer_idx)
        dropout = attn.attention_dropout if attn.training else 0.0
        out, _ = attention.row_attention(attn, q, k, v, mask, dropout=dropout, scaling=attn.scaling)
        h = h + attn.o_proj(out.reshape(*shape, -1).contiguous())
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return body.norm(h)
