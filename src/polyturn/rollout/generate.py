"""Batched, incremental sampling of actions for many conversations at once.

:class:`BatchDecoder` keeps one KV cache for a batch of conversations and
grows every row by appending: after an action, the next observation's tokens
are prefilled on top of the cache instead of re-running the whole history, so
a turn costs only its new tokens. Rows grow by different amounts; the gaps are
pad columns with attention mask 0, and positions count real tokens only, so a
row's logits equal those of its real tokens run alone (tested).

The cache (:class:`KVCache`) and the attention mask live in preallocated
buffers that double when full, so a decoding step writes its new column in
place instead of copying the whole cache with ``torch.cat`` (43% of the
collector's time before, DESIGN.md). A step's sampled tokens and log-probs
cross to the host once per step, not once per row.

Why not ``generate()``: it re-prefills the whole context every turn, cannot
keep a cache across turns of a multi-turn episode, and spent ~10x the FLOP
floor of its decode steps in overhead here (DESIGN.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer


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


def _grown(buf: torch.Tensor, need: int, dim: int) -> torch.Tensor:
    """``buf`` with room for ``need`` entries along ``dim`` (capacity doubles; the old entries are copied once)."""
    cap = buf.shape[dim]
    if need <= cap:
        return buf
    shape = list(buf.shape)
    shape[dim] = max(need, 2 * cap, 64)
    new = buf.new_zeros(shape)
    new.narrow(dim, 0, cap).copy_(buf)
    return new


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in a buffer that doubles when full; ``update`` writes in place.

    ``keys`` / ``values`` are views of the first ``length`` columns, so every
    transformers code path that reads a :class:`DynamicLayer` (mask sizes,
    sequence length) reads this one unchanged.
    """

    def __init__(self, capacity: int = 256) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self._k = key_states.new_zeros(b, h, self.capacity, d)
        self._v = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.length = 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, k = self.length, key_states.shape[-2]
        self._k = _grown(self._k, n + k, 2)
        self._v = _grown(self._v, n + k, 2)
        self._k[:, :, n : n + k] = key_states
        self._v[:, :, n : n + k] = value_states
        self.length = n + k
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def select(self, rows: torch.Tensor, start: int) -> None:
        """Keep only ``rows`` (batch indices) and the columns from ``start`` on (compacted copies)."""
        if not self.is_initialized:
            return
        self._k = self._k[rows, :, start : self.length].contiguous()
        self._v = self._v[rows, :, start : self.length].contiguous()
        self.length -= start
        self.keys, self.values = self._k, self._v

    def reset(self) -> None:
        self.length = 0
        self._k = self._v = None
        super().reset()


class KVCache(Cache):
    """A transformers :class:`Cache` of :class:`PreallocatedLayer` s (one per decoder layer, made on first use)."""

    def __init__(self, capacity: int = 256) -> None:
        super().__init__(layer_class_to_replicate=lambda: PreallocatedLayer(capacity))


def sample_categorical(probs: torch.Tensor, *, generator: torch.Generator | None, block: int = 256) -> torch.Tensor:
    """One draw per row of ``probs`` ``[B, V]`` (rows need not sum to 1) by two-level inverse-CDF sampling.

    A uniform draw per row picks a block of ``block`` tokens by the blocks'
    cumulative mass, then a token inside it: two small float64 cumsums and
    one uniform number per row. ``torch.multinomial`` draws an exponential
    number for every vocabulary entry instead: 65 ms against 1.6 ms per draw at
    SmolLM2's 49k vocabulary and 64 rows on one CPU thread (``benchmarks/sampler.py``).
    """
    b, v = probs.shape
    pad = (-v) % block
    pp = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).reshape(b, -1, block)
    mass = pp.sum(-1, dtype=torch.float64)  # [B, blocks]
    cum = mass.cumsum(-1)
    u = torch.rand(b, 1, generator=generator, dtype=torch.float64, device=probs.device) * cum[:, -1:]
    blk = torch.searchsorted(cum, u).clamp_(max=cum.shape[1] - 1)
    rest = u - (cum.gather(-1, blk) - mass.gather(-1, blk))
    inner = pp[torch.arange(b, device=probs.device), blk.squeeze(-1)].double().cumsum(-1)
    tok = torch.searchsorted(inner, rest).clamp_(max=block - 1)
    return (blk * block + tok).squeeze(-1).clamp_(max=v - 1)


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
        choice = sample_categorical(sorted_p * keep, generator=generator)
        tokens = order.gather(-1, choice[:, None]).squeeze(-1)
    else:
        tokens = sample_categorical(probs, generator=generator)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class BatchDecoder:
    """A growing batch of token sequences with one KV cache.

    Call :meth:`reset` with each row's starting context, then alternate
    :meth:`sample` (one action per active row) and :meth:`append` (the forced
    tokens that follow: the rest of the end-of-message text and the next
    observation). Tokens sampled but not yet in the cache are kept as
    ``pending`` and go in front of the next append.

    Every tensor lives on the model's device; ``autocast`` (e.g.
    :meth:`polyturn.runtime.Runtime.autocast`) wraps each forward pass.
    A ``generator`` passed to :meth:`sample` must be on the same device.
    """

    def __init__(self, model: nn.Module, *, pad_id: int, stop_id: int,
                 autocast: Callable[[], AbstractContextManager] | None = None) -> None:
        self.model = model
        self.pad_id = pad_id
        self.stop_id = stop_id
        self.autocast = autocast or contextlib.nullcontext
        self.device = next(model.parameters()).device
        self.cache: KVCache | None = None
        self._attn: torch.Tensor | None = None  # [B, capacity] 1 on real tokens; the first `width` columns are used
        self._width = 0
        self.next_pos: torch.Tensor | None = None  # [B] real tokens so far
        self.last_logits: torch.Tensor | None = None  # [B, V] next-token logits per row
        self.pending: list[list[int]] = []

    @property
    def width(self) -> int:
        """Columns in the cache, pads included."""
        return self._width

    @torch.no_grad()
    def reset(self, contexts: list[list[int]]) -> None:
        """Start a fresh cache holding ``contexts`` (each non-empty)."""
        if any(len(c) == 0 for c in contexts):
            raise ValueError("Expected every starting context to hold at least one token, got an empty one")
        b = len(contexts)
        cap = max(len(c) for c in contexts) + 256
        self.cache = KVCache(capacity=cap)
        self._attn = torch.zeros(b, cap, dtype=torch.long, device=self.device)
        self._width = 0
        self.next_pos = torch.zeros(b, dtype=torch.long, device=self.device)
        self.last_logits = None
        self.pending = [[] for _ in range(b)]
        self._feed([list(c) for c in contexts])

    def restart_row(self, i: int) -> None:
        """Forget row ``i``: its columns are masked out and positions restart at 0.

        The next :meth:`append` for the row then computes exactly as a fresh
        context would, so a finished episode's slot takes a new one without
        rebuilding the batch (continuous batching).
        """
        assert self._attn is not None and self.next_pos is not None
        self._attn[i] = 0
        self.next_pos[i] = 0
        self.pending[i] = []

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (kept in that order) and the leading columns no kept row uses.

        A batch whose episodes have mostly ended still paid for every row and
        every column in each decoding step; compacting it makes the tail of a
        collection as cheap per live row as its start. Rows keep their
        positions, so their logits are those of their real tokens as before
        (up to float rounding from the smaller shapes).
        """
        assert self._attn is not None and self.next_pos is not None and self.cache is not None
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        attn = self._attn[idx, : self._width]
        used = attn.any(0).nonzero()
        start = int(used[0]) if len(used) else self._width
        for layer in self.cache.layers:
            layer.select(idx, start)
        self._attn = attn[:, start:].contiguous()
        self._width -= start
        self.next_pos = self.next_pos[idx]
        if self.last_logits is not None:
            self.last_logits = self.last_logits[idx]
        self.pending = [self.pending[i] for i in rows]

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
        b = len(rows)
        n = max(len(r) for r in rows)
        ids = torch.full((b, n), self.pad_id, dtype=torch.long)
        mask = torch.zeros(b, n, dtype=torch.long)
        offs = torch.zeros(b, n, dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                k = len(r)
                ids[i, n - k:] = torch.tensor(r, dtype=torch.long)
                mask[i, n - k:] = 1
                offs[i, n - k:] = torch.arange(k)
        self._forward(ids.to(self.device), mask.to(self.device), offs.to(self.device))

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, offs: torch.Tensor) -> None:
        """Run ``ids`` ``[B, n]`` (on the device) as the next ``n`` columns; ``offs`` counts each row's new real tokens."""
        assert self._attn is not None and self.next_pos is not None
        n = ids.shape[1]
        self._attn = _grown(self._attn, self._width + n, 1)
        self._attn[:, self._width : self._width + n] = mask
        self._width += n
        pos = self.next_pos[:, None] + offs
        with self.autocast():
            out = self.model(
                input_ids=ids,
                attention_mask=self._attn[:, : self._width],
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
        on_done: Callable[[int, SampledAction], None] | None = None,
    ) -> list[SampledAction | None]:
        """Sample one action for each active row (forced rows follow their given ids).

        ``on_done(row, action)`` is called as soon as a row's action is complete, while other rows
        may still be decoding: the collector starts that row's environment step there, in a thread.
        """
        assert self.last_logits is not None, "call reset() first"
        b = len(active)
        forced = forced or [None] * b
        any_forced = any(f is not None for f in forced)
        running = list(active)
        ids: list[list[int]] = [[] for _ in range(b)]
        lps: list[list[float]] = [[] for _ in range(b)]
        zeros = torch.zeros(b, 1, dtype=torch.long, device=self.device)
        for step in range(max_new_tokens):
            tokens, logp = sample_from_logits(
                self.last_logits, temperature=temperature, top_p=top_p, generator=generator
            )
            if any_forced:
                fix = [(i, f[step]) for i, f in enumerate(forced) if f is not None and running[i] and step < len(f)]
                if fix:
                    rows, toks = zip(*fix)
                    tokens[list(rows)] = torch.tensor(toks, dtype=tokens.dtype, device=self.device)
                # Forced ids need the policy's log-prob of those ids, not of a sampled one.
                t = temperature if temperature > 0 else 1.0
                logp = torch.log_softmax(self.last_logits / t, -1).gather(-1, tokens[:, None]).squeeze(-1)
            # One transfer to the host per step (a per-row .item() is a device sync per row per token).
            tok_host, lp_host = tokens.tolist(), logp.tolist()
            sampled_now = [i for i in range(b) if running[i]]
            last = step == max_new_tokens - 1
            for i in sampled_now:
                ids[i].append(tok_host[i])
                lps[i].append(lp_host[i])
                if tok_host[i] == self.stop_id or last:
                    running[i] = False
                    if on_done is not None:
                        on_done(i, self._action(ids[i], lps[i], forced[i]))
            if not any(running):
                for i in sampled_now:
                    self.pending[i] = [ids[i][-1]]
                break
            live = torch.zeros(b, 1, dtype=torch.long)
            live[sampled_now] = 1
            live = live.to(self.device)
            step_ids = torch.where(live.bool(), tokens[:, None], torch.full_like(live, self.pad_id))
            self._forward(step_ids, live, zeros)
        return [self._action(ids[i], lps[i], forced[i]) if active[i] else None for i in range(b)]

    def _action(self, ids: list[int], lps: list[float], forced: list[int] | None) -> SampledAction:
        return SampledAction(ids=ids, logprobs=lps, hit_cap=bool(ids) and ids[-1] != self.stop_id,
                             forced=forced is not None)
