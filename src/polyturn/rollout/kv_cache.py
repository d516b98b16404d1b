"""The decoder's KV cache: one row per conversation, each row writing its ``t``-th token at cache column ``t``.

:class:`KVCache` is a ``transformers`` :class:`~transformers.cache_utils.Cache` of :class:`RowLayer` layers, held
by :class:`polyturn.rollout.generate.BatchDecoder`: rows of different lengths leave no pad columns, a finished
row restarts at column 0, and the buffers are preallocated (sized once from a capacity, else doubled when full),
so a decoding step writes its new column in place instead of copying the cache with ``torch.cat``.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


def _grown(buf: torch.Tensor, need: int, dim: int) -> torch.Tensor:
    """``buf`` with room for ``need`` entries along ``dim`` (capacity doubles; the old entries are copied once).

    The new entries are left uninitialised (:class:`RowLayer` zeroes columns as its width reaches them)."""
    cap = buf.shape[dim]
    if need <= cap:
        return buf
    shape = list(buf.shape)
    shape[dim] = max(need, 2 * cap, 64)
    new = buf.new_empty(shape)
    new.narrow(dim, 0, cap).copy_(buf)
    return new


def _stored_dtype(states: torch.Tensor) -> torch.dtype:
    """The dtype a cache keeps keys and values in: autocast's when it is on (the attention products read them
    in it), else the states' own.

    Under bf16 autocast the keys leave the rotary embedding in float32 (its tables are float32) and the values
    in bf16. Kept in float32, every decode step's products re-cast each layer's whole key cache to bf16 (read
    4 bytes and write 2 per entry, then read the copy); kept in bf16 the cache is a third smaller and the
    query-key product copies them at 2 bytes (:func:`polyturn.rollout.attention._dense`). Autocast rounds them
    to bf16 before the products either way, so the result is the same to the bit (tested).
    """
    kind = states.device.type
    if torch.is_autocast_enabled(kind) and states.is_floating_point():
        return torch.get_autocast_dtype(kind)
    return states.dtype


class RowLayer(DynamicLayer):
    """One layer's keys and values, ``[B, heads, capacity, dim]``, where each row writes at its own columns.

    Row ``i``'s token ``t`` lives in column ``t``: rows of different lengths leave no pad columns between
    their tokens, and a restarted row overwrites its old columns from 0. The owning :class:`KVCache` sets
    the columns of the next write (``cols``, ``[B, n]``) and the width every row's attention reads;
    ``keys`` / ``values`` are views of the first ``width`` columns, so every transformers code path that
    reads a :class:`DynamicLayer` reads this one unchanged.

    The buffers are allocated uninitialised and zeroed a column range at a time, as the width first reaches it
    (``_clean``: every row's first ``_clean`` columns hold zeros or written entries). A row's columns between its
    own length and the width are read under the attention mask, so they must be finite, not garbage (a masked
    NaN still poisons the product); columns past the width are never read. On the CPU an untouched page costs no
    memory, so a cache reserving the context budget holds only the columns its rows reach
    (benchmarks/kv_cache.py).
    """

    def __init__(self, owner: "KVCache") -> None:
        super().__init__()
        self.owner = owner
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._clean = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self._k = key_states.new_empty(b, h, self.owner.capacity, d, dtype=_stored_dtype(key_states))
        self._v = value_states.new_empty(b, h, self.owner.capacity, value_states.shape[-1],
                                         dtype=_stored_dtype(value_states))
        self._clean = 0
        self.is_initialized = True

    def make_room(self, width: int) -> None:
        """Grow the buffers to the owner's capacity and zero the columns up to ``width`` not yet touched;
        called before any write or read of columns below ``width``."""
        cap = self.owner.capacity
        self._k, self._v = _grown(self._k, cap, 2), _grown(self._v, cap, 2)
        if width > self._clean:
            self._k[:, :, self._clean : width].zero_()
            self._v[:, :, self._clean : width].zero_()
            self._clean = width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        o = self.owner
        self.make_room(o.width)  # every column written this step is below the width
        # [r, n] columns, one per new token of each row run; advanced indices around a slice put [r, n] first.
        self._k[o.row_index, :, o.cols] = key_states.transpose(1, 2).to(self._k.dtype)
        self._v[o.row_index, :, o.cols] = value_states.transpose(1, 2).to(self._v.dtype)
        if o.rows is not None:  # a subset of the rows ran: their keys and values, gathered (from column start)
            return self._k[o.rows, :, o.start : o.width], self._v[o.rows, :, o.start : o.width]
        self.keys = self._k[:, :, : o.width]
        self.values = self._v[:, :, : o.width]
        if o.start:
            return self._k[:, :, o.start : o.width], self._v[:, :, o.start : o.width]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.owner.width

    def select(self, rows: list[int], width: int) -> None:
        """Keep only batch rows ``rows`` (in that order); their first ``width`` columns are what is read.

        Rows kept in order, none twice (a collection's tail dropping its finished episodes), move within the
        same buffer, whose capacity stays: a new buffer on the CPU pays a page fault for every 4 KiB it
        touches first (zeroing one costs ~4x copying as many bytes into touched memory: benchmarks/kv_cache.py),
        and the next write would have grown a compacted copy back to capacity, a second new buffer. The dropped rows' memory is held
        until the next reset. Repeated or reordered rows (k candidates from one context) are gathered into a new
        buffer of ``width`` columns.
        """
        if not self.is_initialized:
            return
        self.make_room(width)
        if all(a < b for a, b in zip(rows, rows[1:])):  # strictly increasing: j <= rows[j] for every j
            for j, r in enumerate(rows):  # j <= r: row r is read before anything is written over it
                if j != r:
                    self._k[j, :, :width].copy_(self._k[r, :, :width])
                    self._v[j, :, :width].copy_(self._v[r, :, :width])
            self._k, self._v = self._k[: len(rows)], self._v[: len(rows)]
        else:
            idx = torch.tensor(rows, dtype=torch.long, device=self._k.device)
            self._k = self._k[idx, :, :width].contiguous()
            self._v = self._v[idx, :, :width].contiguous()
            self._clean = width
        self.keys, self.values = self._k[:, :, :width], self._v[:, :, :width]

    def reset(self) -> None:
        self._k = self._v = None
        self._clean = 0
        super().reset()


class KVCache(Cache):
    """A transformers :class:`Cache` of :class:`RowLayer` s (one per decoder layer, made on first use).

    :meth:`BatchDecoder` calls :meth:`prepare` before each forward pass with the columns each row writes.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self.width = 0
        self.start = 0
        self.cols: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        self.row_index: torch.Tensor | None = None
        super().__init__(layer_class_to_replicate=lambda: RowLayer(self))

    def write_prefix(self, prefix: list[tuple[torch.Tensor, torch.Tensor]], rows: list[int], batch: int) -> None:
        """Copy a prefix's keys and values (per layer ``[1, H, P, D]``) into columns ``0..P-1`` of ``rows``."""
        n = prefix[0][0].shape[2]
        if n > self.capacity:
            self.capacity = max(n, 2 * self.capacity, 64)
        idx = torch.tensor(rows, dtype=torch.long, device=prefix[0][0].device)
        for layer_idx, (pk, pv) in enumerate(prefix):
            while len(self.layers) <= layer_idx:
                self.layers.append(self.layer_class_to_replicate())
            layer = self.layers[layer_idx]
            if not layer.is_initialized:
                layer.lazy_initialization(pk.expand(batch, -1, -1, -1), pv.expand(batch, -1, -1, -1))
            layer.make_room(n)
            layer._k[idx, :, :n] = pk.to(layer._k.dtype)
            layer._v[idx, :, :n] = pv.to(layer._v.dtype)

    def prepare(self, cols: torch.Tensor, width: int, rows: torch.Tensor | None = None, start: int = 0) -> None:
        """The next forward runs batch rows ``rows`` (all when None) and writes the ``j``-th one's new tokens
        at columns ``cols[j]``; attention reads ``width`` columns, of which each layer's :meth:`RowLayer.update`
        returns those from ``start`` on (a shared prefix's columns read elsewhere:
        :class:`~polyturn.rollout.attention.SharedPrefix` ``sliced``)."""
        if width > self.capacity:
            self.capacity = max(width, 2 * self.capacity, 64)  # layers grow on their next update
        self.cols = cols
        self.rows = rows
        self.row_index = (torch.arange(cols.shape[0], device=cols.device) if rows is None else rows)[:, None]
        self.width = width
        self.start = start


#: Contexts sharing at least this many leading tokens (a system prompt) compute them once per reset.
