"""Several candidate turns from the same state, through the rollout engine, with their exact ids and log-probs.

Turn-level DPO samples ``k`` candidates at states of collected episodes; best-of-n
samples ``n`` at each live conversation and keeps the critic's favourite. Both
read the ids the actor sampled and the behaviour log-probs the decoder
recorded, never a re-tokenisation of the text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polyturn.models.actor import Actor
from polyturn.rollout.generate import BatchDecoder, SampledAction
from polyturn.rollout.types import Episode


def sample_candidates(actor: Actor, contexts: Sequence[list[int]], *, k: int, temperature: float, top_p: float = 1.0,
                      max_new_tokens: int, generator: torch.Generator | None = None) -> list[list[SampledAction]]:
    """``k`` actions sampled independently at each context (one batch of ``len(contexts) * k`` rows).

    Returns, per context, its ``k`` actions in sampling order.
    """
    if k < 1:
        raise ValueError(f"Expected k >= 1 candidates, got {k}")
    if not contexts:
        return []
    dec = BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id, autocast=actor.autocast)
    with torch.no_grad():
        dec.reset([list(c) for c in contexts])  # each context encoded once,
        if k > 1:  # then its cache rows copied k times
            dec.keep_rows([i for i in range(len(contexts)) for _ in range(k)])
        acts = dec.sample(active=[True] * (len(contexts) * k), temperature=temperature, top_p=top_p,
                          max_new_tokens=max_new_tokens, generator=generator)
    return [[a for a in acts[i * k : (i + 1) * k] if a is not None] for i in range(len(contexts))]


def turn_context(ep: Episode, t: int) -> list[int]:
    """The token ids the actor read before writing turn ``t`` of ``ep`` (the prefix its action was sampled after)."""
    for seg in ep.segments:
        if t in seg.turn_index:
            return list(seg.ids[: seg.turn_index.index(t)])
    raise ValueError(f"Expected turn {t} in one of the episode's segments, got none holding it "
                     f"(the episode has {len(ep.turns)} turns)")


def action_text(actor: Actor, act: SampledAction) -> str:
    """The text the environment receives for ``act`` (its ids without the stop token), as the collector decodes it."""
    return actor.tokenizer.decode(act.ids if act.hit_cap else act.ids[:-1], skip_special_tokens=False)
