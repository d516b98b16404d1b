"""Exploration in production: epsilon-greedy over sampled candidates, with a confidence filter.

With probability ``epsilon`` a turn is *explored*: ``candidates`` actions are
sampled from the policy at ``temperature`` (their own small batch, from the
session's context), candidates whose mean token log-prob is below
``min_mean_logprob`` are dropped (the policy is not confident in them), and
one of the rest, drawn uniformly, replaces the greedy answer. When none pass,
the turn falls back to the normal (greedy) answer. With ``min_value`` set and
a critic in the checkpoint (``critic/``), the critic's value of the current
state gates exploration too: a state with V(s) below ``min_value`` is not
explored (the greedy answer stands). Explored turns are logged,
counted in ``/metrics`` and recorded with ``forced: true``; their log-probs
are the policy's for the chosen ids, as in training's epsilon exploration.
Off by default (``epsilon = 0``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from polyturn.models.actor import Actor
from polyturn.rollout.generate import BatchDecoder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExploreSettings:
    """Exploration knobs (server flags ``--explore-*``)."""

    epsilon: float = 0.0
    candidates: int = 4
    temperature: float = 1.0
    min_mean_logprob: float = -1.0
    min_value: float | None = None
    #: Allow a value critic that reads privileged text (``--explore-oracle-critic``): an oracle experiment,
    #: since at deployment that text does not exist.
    oracle_critic: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"Expected explore epsilon in [0, 1], got {self.epsilon}")
        if self.candidates < 0:
            raise ValueError(f"Expected explore candidates >= 0, got {self.candidates}")
        if self.temperature <= 0:
            raise ValueError(f"Expected explore temperature > 0, got {self.temperature}")


@torch.no_grad()
def pick_candidate(
    actor: Actor,
    context: list[int],
    settings: ExploreSettings,
    *,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
) -> tuple[list[int] | None, dict]:
    """Sample candidates after ``context``; return ``(chosen ids or None, what happened)``.

    The chosen ids end with the stop token (a capped candidate is closed with
    it), ready to be forced on the session's row.
    """
    k = settings.candidates
    dec = BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id)
    dec.reset([list(context)] * k)
    acts = dec.sample(active=[True] * k, temperature=settings.temperature, max_new_tokens=max_new_tokens,
                      generator=generator)
    cands = []
    for a in acts:
        assert a is not None
        mean_lp = sum(a.logprobs) / max(1, len(a.logprobs))
        ids = list(a.ids) if not a.hit_cap else list(a.ids[:-1]) + [actor.stop_id]
        cands.append((ids, mean_lp))
    passing = [c for c in cands if c[1] >= settings.min_mean_logprob]
    info = {"candidates": len(cands), "passed": len(passing),
            "mean_logprobs": [round(c[1], 4) for c in cands], "chosen": None}
    if not passing:
        log.info("exploration: no candidate above mean log-prob %.2f; greedy answer kept", settings.min_mean_logprob)
        return None, info
    j = int(torch.randint(len(passing), (1,), generator=generator,
                          device=generator.device if generator is not None else None))
    ids, mean_lp = passing[j]
    info["chosen"] = round(mean_lp, 4)
    log.info("exploration: candidate %d of %d (mean log-prob %.3f) replaces the greedy answer",
             j, len(passing), mean_lp)
    return ids, info
