"""Preference pairs of two turns from one state, and their summed log-probs: what turn-level DPO trains on
(``ppo.algo: turn_dpo``, :mod:`polyturn.train.turn_dpo`; refusal pairs, :mod:`polyturn.train.refusals`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from polyturn.models.actor import Actor
from polyturn.rollout.generate import SampledAction
from polyturn.rollout.types import Segment
from polyturn.train.batch import TokenBatch, make_token_batch, micro_batches, policy_output


class CandidatePair:
    """One preference: the state's context ids and the two candidate turns taken there."""

    def __init__(self, context: list[int], chosen: SampledAction, rejected: SampledAction) -> None:
        self.context, self.chosen, self.rejected = context, chosen, rejected
        #: The reference policy's summed log-probs of (chosen, rejected), set once per update by
        #: :meth:`TurnDPO.set_reference`.
        self.ref: tuple[float, float] | None = None

    def segment(self, act: SampledAction) -> Segment:
        """The context followed by ``act``, its tokens marked as sampled with their behaviour log-probs."""
        seg = Segment()
        seg.add_context(self.context)
        seg.add_action(list(act.ids), list(act.logprobs), turn=0)
        return seg

    def segments(self) -> tuple[Segment, Segment]:
        """The chosen and the rejected turn, each after the shared context."""
        return self.segment(self.chosen), self.segment(self.rejected)


def pair_micro_batches(pairs: Sequence[CandidatePair], budget: int | None, *,
                       share_context: bool = False) -> list[list[int]]:
    """``pairs`` in length-sorted micro-batches of at most ``budget`` padded tokens (a pair's two rows together).

    ``share_context`` (``actor.shared_prefix``): one pair a micro-batch, longest first, so that its two rows share
    their whole context (:func:`pair_batch`) and the forward pass runs it once: a CustomerService pair is a ~1,200
    token context and two turns of ~50, where several pairs a micro-batch share only the system prompt."""
    lengths = [[len(pr.context) + len(a.ids) for a in (pr.chosen, pr.rejected)] for pr in pairs]
    if share_context:
        return [[i] for i in sorted(range(len(pairs)), key=lambda i: (-max(lengths[i]), i))]
    return micro_batches(lengths, budget)


def pair_batch(pairs: Sequence[CandidatePair], micro: Sequence[int], actor: Actor, *,
               share_context: bool = False) -> TokenBatch:
    """The micro-batch ``micro`` of ``pairs`` as rows chosen, rejected, chosen, ...; with ``share_context`` the
    rows' common prefix marked for one shared pass (:func:`~polyturn.train.batch.make_token_batch`)."""
    segs = [s for i in micro for s in pairs[i].segments()]
    return make_token_batch(list(enumerate(segs)), pad_id=actor.pad_id, device=actor.runtime.device,
                            share_prefix=share_context)


@torch.no_grad()
def summed_logprobs(actor: Actor, pairs: Sequence[CandidatePair], *, temperature: float,
                    budget: int | None, chosen_prefix: bool = False, share_context: bool = False,
                    progress: Callable[[int], None] | None = None) -> torch.Tensor:
    """``[P, 2]`` float32 on the host: each pair's summed log-probs of its chosen and rejected turn under ``actor``,
    in micro-batches of at most ``budget`` padded tokens (one pair each, its context run once, with
    ``share_context``). ``chosen_prefix``: ``[P, 3]``, the third column the chosen turn's over its first
    ``len(rejected)`` tokens only (for a fork pair, through the token where the two part). ``progress`` is
    advanced by each micro-batch's pairs."""
    out = torch.zeros(len(pairs), 3 if chosen_prefix else 2)
    for micro in pair_micro_batches(pairs, budget, share_context=share_context):
        batch = pair_batch(pairs, micro, actor, share_context=share_context)
        tok = policy_output(actor, batch, temperature=temperature).logprobs.float() * batch.action_mask
        out[micro, :2] = tok.sum(1).view(len(micro), 2).cpu()
        if chosen_prefix:
            out[micro, 2] = chosen_through_rejected(tok, batch, [pairs[i] for i in micro]).cpu()
        if progress is not None:
            progress(len(micro))
    return out


def chosen_through_rejected(tok: torch.Tensor, batch: TokenBatch, pairs: Sequence[CandidatePair]) -> torch.Tensor:
    """``[M]``: each pair's chosen turn's log-probs summed over its first ``len(rejected)`` action tokens only (for a
    fork pair, through the token where the two part), from a :func:`pair_batch`'s masked per-token log-probs
    ``tok`` (rows chosen, rejected, ...)."""
    return (tok[0::2] * chosen_mask_through_rejected(batch, pairs)).sum(1)


def chosen_mask_through_rejected(batch: TokenBatch, pairs: Sequence[CandidatePair]) -> torch.Tensor:
    """``[M, L]``: a :func:`pair_batch`'s chosen rows' action mask over each pair's first ``len(rejected)`` action
    tokens only (for a fork pair, through the token where the two part)."""
    mask = batch.action_mask[0::2]
    cut = torch.tensor([len(pr.rejected.ids) for pr in pairs], device=mask.device)[:, None]
    return mask * (mask.cumsum(1) <= cut)
