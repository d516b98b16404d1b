"""Batched, incremental sampling of actions for many conversations at once.

:class:`BatchDecoder` keeps one KV cache for a batch of conversations and
grows every row by appending: after an action, the next observation's tokens
are prefilled on top of the cache instead of re-running the whole history, so
a turn costs only its new tokens. Row ``i``'s ``t``-th token lives in cache
column ``t`` (:class:`KVCache`, each row writes at its own columns): rows of
different lengths leave no pad columns, a finished episode's row restarts at
column 0, and a step's attention reads only as many columns as the longest row
holds. A row's logits equal those of its real tokens run alone (tested).

The cache lives in preallocated buffers, so a decoding step writes its new
column in place instead of copying the whole cache with ``torch.cat`` (43% of
the collector's time before, DESIGN.md). Given ``capacity`` (the rollout's
context budget, which no row outgrows) they are sized once at reset, and
zeroed only as far as the rows reach (on the CPU an untouched page holds no
memory); without it, or for a row past it, they double when full. A step's
sampled tokens and log-probs cross to the host once per step, not once per
row. When at most half the rows have new tokens, only those rows run; a block
whose rows' lengths differ much runs in two passes (:func:`prefill_split`).

Why not ``generate()``: it re-prefills the whole context every turn, cannot
keep a cache across turns of a multi-turn episode, and spent ~10x the FLOP
floor of its decode steps in overhead here (DESIGN.md).
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from polyturn.rollout import body as fast_body
from polyturn.rollout.attention import SharedPrefix, decode_attention, shared_prefix
from polyturn.rollout.kv_cache import KVCache


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


MIN_SHARED_PREFIX = 32


def _shared_prefix_len(rows: list[list[int]]) -> int:
    """Leading tokens every row shares, leaving each row at least one token of its own."""
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for r in rows[1:]:
        k = 0
        while k < n and r[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


#: An extra forward pass costs about as much as this many more token positions (its fixed overhead, and
#: the gather of the longer rows' keys and values): :func:`prefill_split` splits only when it saves more.
SPLIT_OVERHEAD = 64


def prefill_split(counts: list[int], overhead: int | None = None) -> int:
    """The first pass's length when rows holding ``counts`` new tokens are prefilled in at most two passes.

    One pass runs every row with new tokens for ``max(counts)`` positions, pads included: one long
    observation (a 70-token SQL result among 10-token ones) makes most of the block padding (61% of the
    tiny demo's prefill positions, ``benchmarks/rollout.py``). A split runs every row's first ``n`` tokens,
    then only the rows with more, for the rest (chunked prefill); each token still attends to its row's
    columns up to its own, so the result is the same attention. Returns the ``n`` that runs the fewest
    positions, counting ``overhead`` (default :data:`SPLIT_OVERHEAD`) for the second pass; ``max(counts)``
    means one pass.
    """
    overhead = SPLIT_OVERHEAD if overhead is None else overhead
    got = sorted(c for c in counts if c > 0)
    if not got:
        return 0
    longest = got[-1]
    best_n, best_cost = longest, len(got) * longest
    for n in sorted(set(got[:-1])):
        longer = len(got) - bisect.bisect_right(got, n)  # rows with more than n tokens
        cost = len(got) * n + longer * (longest - n) + overhead
        if cost < best_cost:
            best_n, best_cost = n, cost
    return best_n


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

    Row ``i``'s ``t``-th token sits in cache column ``t`` (:class:`KVCache`), so
    rows of different lengths share no pad columns and a step's attention reads
    only as many columns as the longest row holds.

    Every tensor lives on the model's device; ``autocast`` (e.g.
    :meth:`polyturn.runtime.Runtime.autocast`) wraps each forward pass.
    A ``generator`` passed to :meth:`sample` must be on the same device.
    """

    #: Decode steps whose rows all open with the shared prefix get only the columns after it from the cache
    #: (:class:`~polyturn.rollout.attention.SharedPrefix` ``sliced``); False hands every column, as up to
    #: 2026-12-08 (benchmarks/subset_steps.py times both).
    slice_prefix: bool = True

    def __init__(self, model: nn.Module, *, pad_id: int, stop_id: int,
                 autocast: Callable[[], AbstractContextManager] | None = None, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"Expected capacity >= 1 cache columns (or None), got {capacity}")
        self.model = model
        # Columns each row's cache reserves at reset: the context budget, which no row outgrows, so the cache is
        # allocated once instead of doubling (each new buffer was copied and page-faulted: benchmarks/kv_cache.py).
        # It reserves rows x capacity columns of address space up front; the columns are zeroed (and, on the CPU,
        # take memory) only as the rows reach them (RowLayer.make_room). None: the longest starting context + 256,
        # doubling when a row outgrows it.
        self.capacity = capacity
        self.pad_id = pad_id
        self.stop_id = stop_id
        self.autocast = autocast or contextlib.nullcontext
        self.device = next(model.parameters()).device
        # The transformer body and the output head, called apart so that each row's logits come from its
        # own last new token (rows' new tokens are left-aligned in a block) at one head row per batch row.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._body = base.get_decoder()
        self._head = base.get_output_embeddings()
        self._fast = fast_body.supports(self._body)  # its forward without transformers' wrapping (rollout/body.py)
        if getattr(base.config, "final_logit_softcapping", None):
            raise ValueError("Expected a causal LM whose logits are its output head's (no logit soft-capping)")
        self.cache: KVCache | None = None
        self.lengths: list[int] = []  # real tokens in the cache per row (= the row's next position)
        self.last_logits: torch.Tensor | None = None  # [B, V] next-token logits per row
        self.pending: list[list[int]] = []
        # Keys and values of the contexts' shared prefix (a system prompt), computed once per reset.
        self._prefix_ids: list[int] = []
        self._prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._has_prefix: list[bool] = []  # row i's first columns hold the shared prefix
        self.prefix_tokens_reused = 0  # prefix tokens copied instead of computed (benchmarks report it)

    @property
    def shared_prefix(self) -> list[int]:
        """The contexts' shared prefix (a system prompt) as of the last :meth:`reset`, whose keys and values a
        restarted row starting with it copies instead of computing (empty: none)."""
        return self._prefix_ids

    @property
    def width(self) -> int:
        """Columns the rows' attention reads (the longest row)."""
        return max(self.lengths, default=0)

    @torch.no_grad()
    def reset(self, contexts: list[list[int]]) -> None:
        """Start a fresh cache holding ``contexts`` (each non-empty)."""
        if any(len(c) == 0 for c in contexts):
            raise ValueError("Expected every starting context to hold at least one token, got an empty one")
        b = len(contexts)
        longest = max(len(c) for c in contexts)
        self.cache = KVCache(capacity=longest + 256 if self.capacity is None else max(self.capacity, longest))
        self.lengths = [0] * b
        self._has_prefix = [False] * b
        self.last_logits = None
        self.pending = [[] for _ in range(b)]
        rows = [list(c) for c in contexts]
        n = _shared_prefix_len(rows)
        self._prefix_ids, self._prefix_kv = [], []
        if b > 1 and n >= MIN_SHARED_PREFIX:
            self._prefix_ids = rows[0][:n]
            self._prefix_kv = self._encode_prefix(self._prefix_ids)
            self._reuse_prefix(list(range(b)))
            rows = [r[n:] for r in rows]
        self._feed(rows)

    def _encode_prefix(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys and values ``[1, H, P, D]`` of ``ids`` run alone from position 0."""
        n = len(ids)
        tmp = KVCache(capacity=n)
        with self.autocast():
            self._run_body(tmp, torch.tensor([ids], device=self.device), torch.arange(n, device=self.device)[None], n)
        return [(layer._k[:, :, :n].clone(), layer._v[:, :, :n].clone()) for layer in tmp.layers]

    def _reuse_prefix(self, rows: list[int]) -> None:
        """Rows ``rows`` (empty) start with the shared prefix: its keys and values are copied, not computed."""
        assert self.cache is not None
        self.cache.write_prefix(self._prefix_kv, rows, len(self.lengths))
        for i in rows:
            self.lengths[i] = len(self._prefix_ids)
            self._has_prefix[i] = True
        self.prefix_tokens_reused += len(rows) * len(self._prefix_ids)

    def restart_row(self, i: int) -> None:
        """Forget row ``i``: its next tokens are written from column 0, as a fresh context's would be.

        The next :meth:`append` for the row then computes exactly as a fresh
        context would, so a finished episode's slot takes a new one without
        rebuilding the batch (continuous batching).
        """
        self.lengths[i] = 0
        self._has_prefix[i] = False
        self.pending[i] = []

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (kept in that order; :meth:`RowLayer.select`).

        A batch whose episodes have mostly ended still paid for every row in
        each decoding step; compacting it makes the tail of a collection as
        cheap per live row as its start.
        """
        assert self.cache is not None
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.lengths = [self.lengths[i] for i in rows]
        self._has_prefix = [self._has_prefix[i] for i in rows]
        for layer in self.cache.layers:
            layer.select(rows, self.width)
        if self.last_logits is not None:
            self.last_logits = self.last_logits[idx]
        self.pending = [self.pending[i] for i in rows]

    def real_lengths(self) -> list[int]:
        """Real tokens per row, pending ones included."""
        return [n + len(p) for n, p in zip(self.lengths, self.pending)]

    @torch.no_grad()
    def append(self, pieces: list[list[int]]) -> None:
        """Append each row's tokens (pending ones first); rows with nothing new keep their state."""
        rows = [self.pending[i] + list(p) for i, p in enumerate(pieces)]
        self.pending = [[] for _ in rows]
        n = len(self._prefix_ids)
        if n:  # restarted rows whose new context starts with the shared prefix (a new task, same system prompt)
            fresh = [i for i, r in enumerate(rows) if self.lengths[i] == 0 and len(r) > n and r[:n] == self._prefix_ids]
            if fresh:
                self._reuse_prefix(fresh)
                for i in fresh:
                    rows[i] = rows[i][n:]
        if any(rows):
            self._feed(rows)

    def _feed(self, rows: list[list[int]]) -> None:
        """Prefill each row's new tokens, in two passes when one row's block would mostly pad the others'
        (:func:`prefill_split`): every row's first ``n`` tokens, then the longer rows' rest alone."""
        n = prefill_split([len(r) for r in rows])
        if n == max(len(r) for r in rows):
            self._feed_block(rows)
            return
        self._feed_block([r[:n] for r in rows])
        self._feed_block([r[n:] for r in rows])

    def _feed_block(self, rows: list[list[int]]) -> None:
        """Prefill each row's new tokens as a block (left-aligned; the pads after them are never attended)."""
        n = max(len(r) for r in rows)
        ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        self._forward(ids.to(self.device), [len(r) for r in rows])

    def _run_body(self, cache: KVCache, ids: torch.Tensor, pos: torch.Tensor, width: int,
                  rows: torch.Tensor | None = None, shared: SharedPrefix | None = None) -> torch.Tensor:
        """The body's last hidden states for ``ids`` at positions (= cache columns) ``pos``, each token attending
        to its row's columns up to its own; ``rows`` as in :meth:`KVCache.prepare`; ``shared`` as in
        :func:`~polyturn.rollout.attention.decode_attention`. With ``shared``, the cache hands the attention only
        each row's columns after the prefix (``SharedPrefix.sliced``) wherever :func:`row_attention` is the
        attention (a model on SDPA: what ``decode_attention`` switches)."""
        sdpa = self._body.config._attn_implementation == "sdpa"
        sliced = shared is not None and sdpa and self.slice_prefix
        if sliced:
            shared = SharedPrefix(shared.kv, sliced=True)
        cache.prepare(pos, width, rows, start=shared.length if sliced else 0)
        mask = (torch.arange(width, device=self.device) <= pos[:, :, None])[:, None]  # [r, 1, n, width]
        if self._fast and sdpa:
            with shared_prefix(shared):
                return fast_body.body_forward(self._body, ids, pos, mask, cache)
        if not sdpa:  # the model's own attention (eager ...) adds its mask to the scores: 0 or the most negative
            mask = torch.zeros(mask.shape, device=self.device).masked_fill_(~mask, torch.finfo(torch.float32).min)
        with decode_attention(self._body, shared):
            return self._body(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                              use_cache=True).last_hidden_state

    def _forward(self, ids: torch.Tensor, counts: list[int]) -> None:
        """Run ``ids`` ``[B, n]`` (on the device); row ``i``'s first ``counts[i]`` are real new tokens.

        Row ``i``'s block goes to columns ``lengths[i] ...`` at those positions, and each of its tokens
        attends to the row's columns up to its own (the pads past ``counts[i]`` write columns the row
        overwrites later and that no real token reads). When at most half the rows have new tokens (one
        session's message in a server, the last rows still decoding an action), only those rows run.
        """
        assert self.cache is not None
        b, n = ids.shape
        got = [i for i, c in enumerate(counts) if c > 0]
        sub = len(got) < b and (n > 1 or 2 * len(got) <= b)
        rows = torch.tensor(got, dtype=torch.long, device=self.device)
        lengths = [self.lengths[i] for i in got] if sub else self.lengths
        if sub:
            ids = ids[rows]
        start = torch.tensor(lengths, dtype=torch.long, device=self.device)
        pos = start[:, None] + torch.arange(n, device=self.device)  # [r, n] positions = columns
        # Decode steps whose every running row opens with the shared prefix read it once (rows without new
        # tokens also run when most rows have some; their outputs are dropped, so they need not hold it).
        shared = (SharedPrefix(self._prefix_kv) if n == 1 and self._prefix_kv
                  and all(self._has_prefix[i] for i in got) else None)
        with self.autocast():
            hidden = self._run_body(self.cache, ids, pos, max(lengths) + n, rows if sub else None, shared)
            last = torch.tensor([counts[i] - 1 for i in got], dtype=torch.long, device=self.device)
            picked = hidden[torch.arange(len(got), device=self.device) if sub else rows, last]
            logits = self._head(picked).float()
        if len(got) == b:
            self.last_logits = logits
        else:
            if self.last_logits is None:
                self.last_logits = logits.new_zeros(b, logits.shape[-1])
            self.last_logits[rows] = logits
        self.lengths = [l + c for l, c in zip(self.lengths, counts)]

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
            # Rows not decoding write a pad past their end (overwritten later, never attended).
            counts = [0] * b
            for i in sampled_now:
                counts[i] = 1
            self._forward(tokens[:, None], counts)
        return [self._action(ids[i], lps[i], forced[i]) if active[i] else None for i in range(b)]

    def _action(self, ids: list[int], lps: list[float], forced: list[int] | None) -> SampledAction:
        return SampledAction(ids=ids, logprobs=lps, hit_cap=bool(ids) and ids[-1] != self.stop_id,
                             forced=forced is not None)
