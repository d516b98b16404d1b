"""From stored segments to padded tensors, and the actor's log-probs over them.

Targets are shifted: position ``i`` of the ``[S, L-1]`` tensors is the
prediction of ``ids[i+1]`` from ``ids[:i+1]``. ``action_mask`` is 1 only where
that target is a sampled action token, so prompts, observations and forced
end-of-message tokens never enter a policy loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from polyturn.algos.gae import token_advantages
from polyturn.models.actor import Actor
from polyturn.rollout.types import Segment


class TokenBatch(NamedTuple):
    """Right-padded segments of several episodes."""

    input_ids: torch.Tensor  # [S, L] long
    attention_mask: torch.Tensor  # [S, L] long
    action_mask: torch.Tensor  # [S, L-1] float, 1 on sampled target tokens
    turn_index: torch.Tensor  # [S, L-1] long, turn of each target token (-1 elsewhere)
    old_logprobs: torch.Tensor  # [S, L-1] float, behaviour log-probs of target tokens
    episode_index: torch.Tensor  # [S] long, which episode each segment belongs to

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())


def make_token_batch(items: Sequence[tuple[int, Segment]], *, pad_id: int,
                     device: torch.device | str | None = None) -> TokenBatch:
    """Pad ``(episode_index, segment)`` pairs into a :class:`TokenBatch` (on ``device``, default CPU)."""
    if not items:
        raise ValueError("Expected at least one segment, got none")
    n = max(len(seg) for _, seg in items)
    s = len(items)
    ids = torch.full((s, n), pad_id, dtype=torch.long)
    attn = torch.zeros(s, n, dtype=torch.long)
    amask = torch.zeros(s, n, dtype=torch.float32)
    tidx = torch.full((s, n), -1, dtype=torch.long)
    olp = torch.zeros(s, n, dtype=torch.float32)
    for r, (_, seg) in enumerate(items):
        k = len(seg)
        ids[r, :k] = torch.tensor(seg.ids, dtype=torch.long)
        attn[r, :k] = 1
        amask[r, :k] = torch.tensor(seg.action_mask, dtype=torch.float32)
        tidx[r, :k] = torch.tensor(seg.turn_index, dtype=torch.long)
        olp[r, :k] = torch.tensor(seg.logprobs, dtype=torch.float32)
    # The first token of a segment is never an action (segments start with the prompt).
    batch = TokenBatch(
        input_ids=ids,
        attention_mask=attn,
        action_mask=amask[:, 1:],
        turn_index=tidx[:, 1:],
        old_logprobs=olp[:, 1:],
        episode_index=torch.tensor([e for e, _ in items], dtype=torch.long),
    )
    if device is not None and torch.device(device).type != "cpu":
        batch = TokenBatch(*(t.to(device, non_blocking=True) for t in batch))
    return batch


class PolicyOutput(NamedTuple):
    """The actor's view of a :class:`TokenBatch`, on the ``[S, L-1]`` target grid (0 off action tokens)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    correct: torch.Tensor  # 1 where the argmax is the target (BC accuracy)
    hidden: torch.Tensor  # [S, L, H] last hidden states (for the shared critic's value head)


def policy_output(actor: Actor, batch: TokenBatch, *, temperature: float = 1.0) -> PolicyOutput:
    """Log-probs, entropies and argmax hits of the target tokens, computing logits at action tokens only."""
    t = temperature if temperature > 0 else 1.0
    hidden = actor.hidden_states(batch.input_ids, batch.attention_mask)
    sel = batch.action_mask.bool()
    logits = actor.head(hidden[:, :-1][sel]).float() / t  # [N, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, 1:][sel]
    lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    hit = (logits.argmax(-1) == targets).float()

    def grid(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(sel.shape, dtype=x.dtype, device=x.device).masked_scatter(sel, x)

    return PolicyOutput(logprobs=grid(lp), entropy=grid(ent), correct=grid(hit.detach()), hidden=hidden)


def actor_logprobs(actor: Actor, batch: TokenBatch, *, temperature: float = 1.0) -> torch.Tensor:
    """The actor's log-probs ``[S, L-1]`` of the action tokens (0 elsewhere), with gradients."""
    return policy_output(actor, batch, temperature=temperature).logprobs


def segment_advantages(turn_adv: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """Every action token of turn t gets turn t's advantage; ``turn_adv`` is ``[E, T]`` over episodes."""
    turn_adv = turn_adv.to(batch.action_mask.device)
    return token_advantages(turn_adv[batch.episode_index], batch.turn_index) * batch.action_mask
