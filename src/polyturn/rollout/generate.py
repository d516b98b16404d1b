"""Batched, incremental sampling of actions for many conversations at once.

:class:`BatchDecoder` keeps one KV cache for a batch of conversations and
grows every row by appending: after an action, the next observation's tokens
are prefilled on top of the cache instead of re-running the whole history, so
a turn costs only its new tokens. Rows grow by different amounts; the gaps are
pad columns with attention mask 0, and positions count real tokens only, so a
row's logits equal those of its real tokens run alone (tested).

Why not ``generate()``: it re-prefills the whole context every turn, cannot
keep a cache across turns of a multi-turn episode, and spent ~10x the FLOP
floor of its decode steps in overhead here (DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache


@dataclass
class SampledAction:
    """One row's action: the ids the actor produced and their behaviour log-probs.

    ``ids`` ends with the stop token unless ``hit_cap``; ``forced`` marks an
    action imposed by epsilon exploration (its log-probs are the policy's for
    those forced ids).
    """

    ids: list[int]
    logprobs: list[float]
    hit_cap: bool
    forced: bool


def sample_from_logits(
    logits: torch.Tensor, *, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return ``(tokens [B], logprobs [B])``.

    Log-probs are those of the full temperature-scaled distribution (top-p only
    narrows what is drawn), the same distribution training evaluates.
    ``temperature == 0`` is greedy and reports log-probs at temperature 1.
    """
    logits = logits.float()
    if temperature <= 0:
        tokens = logits.argmax(-1)
        logp = torch.log_softmax(logits, -1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, -1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # always keeps the most likely token
        sorted_p = sorted_p * keep
        choice = torch.multinomial(sorted_p, 1, generator=generator)
        tokens = order.gather(-1, choice).squeeze(-1)
    else:
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class BatchDecoder:
    """A growing batch of token sequences with one KV cache.

    Call :meth:`reset` with each row's starting context, then alternate
    :meth:`sample` (one action per active row) and :meth:`append` (the forced
    tokens that follow: the rest of the end-of-message text and the next
    observation). Tokens sampled but not yet in the cache are kept as
    ``pending`` and go in front of the next append.
    """

    def __init__(self, model: nn.Module, *, pad_id: int, stop_id: int) -> None:
        self.model = model
        self.pad_id = pad_id
        self.stop_id = stop_id
        self.cache: DynamicCache | None = None
        self.attn: torch.Tensor | None = None  # [B, W] 1 on real tokens
        self.next_pos: torch.Tensor | None = None  # [B] real tokens so far
        self.last_logits: torch.Tensor | None = None  # [B, V] next-token logits per row
        self.pending: list[list[int]] = []

    @property
    def width(self) -> int:
        """Columns in the cache, pads included."""
        return 0 if self.attn is None else int(self.attn.shape[1])

    @torch.no_grad()
    def reset(self, contexts: list[list[int]]) -> None:
        """Start a fresh cache holding ``contexts`` (each non-empty)."""
        if any(len(c) == 0 for c in contexts):
            raise ValueError("Expected every starting context to hold at least one token, got an empty one")
        b = len(contexts)
        self.cache = DynamicCache()
        self.attn = torch.zeros(b, 0, dtype=torch.long)
        self.next_pos = torch.zeros(b, dtype=torch.long)
        self.last_logits = None
        self.pending = [[] for _ in range(b)]
        self._feed([list(c) for c in contexts])

    def restart_row(self, i: int) -> None:
        """Forget row ``i``: its columns are masked out and positions restart at 0.

        The next :meth:`append` for the row then computes exactly as a fresh
        context would, so a finished episode's slot takes a new one without
        rebuilding the batch (continuous batching).
        """
        assert self.attn is not None and self.next_pos is not None
        self.attn[i] = 0
        self.next_pos[i] = 0
        self.pending[i] = []

    def real_lengths(self) -> list[int]:
        """Real tokens per row (what a compacted cache would hold)."""
        assert self.next_pos is not None
        return [int(x) + len(p) for x, p in zip(self.next_pos.tolist(), self.pending)]

    @torch.no_grad()
    def append(self, pieces: list[list[int]]) -> None:
        """Append each row's tokens (pending ones first); rows with nothing new keep their state."""
        rows = [self.pending[i] + list(p) for i, p in enumerate(pieces)]
        self.pending = [[] for _ in rows]
        if any(rows):
            self._feed(rows)

    def _feed(self, rows: list[list[int]]) -> None:
        """Prefill a block of new columns; each row's tokens are right-aligned so its last column is real."""
        assert self.attn is not None and self.next_pos is not None
        b = len(rows)
        n = max(len(r) for r in rows)
        ids = torch.full((b, n), self.pad_id, dtype=torch.long)
        mask = torch.zeros(b, n, dtype=torch.long)
        pos = torch.zeros(b, n, dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                k = len(r)
                ids[i, n - k:] = torch.tensor(r, dtype=torch.long)
                mask[i, n - k:] = 1
                pos[i, n - k:] = self.next_pos[i] + torch.arange(k)
        self.attn = torch.cat([self.attn, mask], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.attn,
            position_ids=pos,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1].float()
        got = mask[:, -1].bool()
        if self.last_logits is None:
            self.last_logits = logits
        else:
            self.last_logits = torch.where(got[:, None], logits, self.last_logits)
        self.next_pos = self.next_pos + mask.sum(1)

    @torch.no_grad()
    def sample(
        self,
        *,
        active: list[bool],
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        forced: list[list[int] | None] | None = None,
        generator: torch.Generator | None = None,
    ) -> list[SampledAction | None]:
        """Sample one action for each active row (forced rows follow their given ids)."""
        assert self.last_logits is not None, "call reset() first"
        b = len(active)
        forced = forced or [None] * b
        running = torch.tensor(active, dtype=torch.bool)
        ids: list[list[int]] = [[] for _ in range(b)]
        lps: list[list[float]] = [[] for _ in range(b)]
        for step in range(max_new_tokens):
            tokens, logp = sample_from_logits(
                self.last_logits, temperature=temperature, top_p=top_p, generator=generator
            )
            for i in range(b):
                f = forced[i]
                if f is not None and running[i] and step < len(f):
                    tokens[i] = f[step]
            if any(f is not None for f in forced):
                # Forced ids need the policy's log-prob of those ids, not of a sampled one.
                t = temperature if temperature > 0 else 1.0
                logp = torch.log_softmax(self.last_logits / t, -1).gather(-1, tokens[:, None]).squeeze(-1)
            sampled_now = running.clone()
            for i in torch.nonzero(sampled_now).flatten().tolist():
                tok = int(tokens[i])
                ids[i].append(tok)
                lps[i].append(float(logp[i]))
                if tok == self.stop_id:
                    running[i] = False
            if not running.any() or step == max_new_tokens - 1:
                for i in torch.nonzero(sampled_now).flatten().tolist():
                    self.pending[i] = [ids[i][-1]]
                break
            self._feed([[int(tokens[i])] if sampled_now[i] else [] for i in range(b)])
        return [
            SampledAction(
                ids=ids[i],
                logprobs=lps[i],
                hit_cap=bool(ids[i]) and ids[i][-1] != self.stop_id,
                forced=forced[i] is not None,
            )
            if active[i]
            else None
            for i in range(b)
        ]
