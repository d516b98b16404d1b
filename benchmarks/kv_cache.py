"""What the decoder's KV cache costs in new buffers: compaction in place against a new buffer, and a cache sized
from the context budget at reset against one that doubles.

A collection's tail drops its finished episodes (:meth:`polyturn.rollout.generate.BatchDecoder.keep_rows`).
Up to session 26 each layer's keys and values were gathered into a new buffer of ``width`` columns, which the
next write grew back to the cache's capacity (a second new buffer, zeroed). On this CPU a new buffer pays a page
fault for every 4 KiB it first touches, so both cost far more than the bytes they copy. Now rows kept in order
move within the same buffer (:meth:`polyturn.rollout.kv_cache.RowLayer.select`). Both are timed here side by
side, on a SmolLM2-135M-shaped cache (30 layers, 3 key-value heads of 64, bf16), alternating, best of N, after
what one layer's new zeroed buffer costs against copying the same bytes into memory already touched.

Then a batch's rows grow from their starting context to near the context budget, ``--chunk`` columns a step
(every layer written, as a forward pass does): with the cache sized at reset as it was up to session 27 (the
longest context + 256, doubling when full: the serving profile of session 21 put 16.5% of the server's samples
in that growth) against one reserving the budget (``BatchDecoder(capacity=rollout.context_budget)``)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kv_cache.py            # 48 rows -> 24, 2048 columns
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kv_cache.py --quick    # a smaller cache, for a smoke run

(growth: 32 rows, as 32 served sessions, from 700 to 2,000 columns against a 2,048-column budget).

Last, memory: the same budget-sized cache zeroed at reset (session 28) against one zeroed only as the rows'
width reaches the columns (:meth:`polyturn.rollout.kv_cache.RowLayer.make_room`), for 32 rows (a SmolLM2
collection's ``rollout.num_envs``) growing from 700 to ``--mem-to`` columns (SQL episodes end near 900 tokens),
each in a fresh process, reporting its peak resident memory above what it held before the cache.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from polyturn.rollout.kv_cache import KVCache, _grown
from polyturn.runtime import resident_bytes

HEADS, DIM = 3, 64  # SmolLM2-135M's key-value heads and head size


def make_cache(rows: int, capacity: int, layers: int) -> KVCache:
    cache = KVCache(capacity=capacity)
    for _ in range(layers):
        layer = cache.layer_class_to_replicate()
        states = torch.randn(rows, HEADS, 1, DIM).to(torch.bfloat16)
        layer.lazy_initialization(states, states)
        layer._k.normal_()
        layer._v.normal_()
        cache.layers.append(layer)
    return cache


def compact_new_buffer(cache: KVCache, rows: list[int], width: int) -> None:
    """The previous ``select``: gather into a new ``width``-column buffer, then the next write grows it back."""
    idx = torch.tensor(rows, dtype=torch.long)
    for layer in cache.layers:
        layer._k = layer._k[idx, :, :width].contiguous()
        layer._v = layer._v[idx, :, :width].contiguous()
        layer._k = _grown(layer._k, cache.capacity, 2)
        layer._v = _grown(layer._v, cache.capacity, 2)


def compact_in_place(cache: KVCache, rows: list[int], width: int) -> None:
    for layer in cache.layers:
        layer.select(rows, width)
        layer._k = _grown(layer._k, cache.capacity, 2)  # a no-op: the capacity was kept
        layer._v = _grown(layer._v, cache.capacity, 2)


def fresh_against_touched(rows: int, capacity: int, repeats: int) -> tuple[float, float, float]:
    """One layer's buffer ``[rows, HEADS, capacity, DIM]`` in bf16: MB, best seconds of ``new_zeros`` (fresh
    memory), best seconds of copying as many bytes into a buffer already touched."""
    src = torch.randn(rows, HEADS, capacity, DIM).to(torch.bfloat16)
    dst = torch.zeros_like(src)
    fresh, touched = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf = src.new_zeros(src.shape)
        fresh.append(time.perf_counter() - t0)
        del buf
        t0 = time.perf_counter()
        dst.copy_(src)
        touched.append(time.perf_counter() - t0)
    return src.numel() * 2 / 2**20, min(fresh), min(touched)


def grow(rows: int, start: int, final: int, capacity: int, layers: int, chunk: int) -> tuple[float, int]:
    """Rows of ``start`` tokens grow by ``chunk`` columns a step until ``final``, every layer written at each step
    (as :meth:`RowLayer.update` does in a forward pass), from a cache of ``capacity`` columns.

    Returns (seconds, the cache's columns at the end)."""
    cache = KVCache(capacity=capacity)
    for _ in range(layers):
        cache.layers.append(cache.layer_class_to_replicate())
    t0 = time.perf_counter()
    for width in (start, *range(start + chunk, final + 1, chunk)):
        n = start if width == start else chunk
        cols = torch.arange(width - n, width)[None].expand(rows, n)
        cache.prepare(cols, width)
        states = torch.ones(rows, HEADS, n, DIM, dtype=torch.bfloat16)
        for layer in cache.layers:
            layer.update(states, states)
    return time.perf_counter() - t0, cache.layers[0]._k.shape[2]


def grow_memory(zero_at_reset: bool, rows: int, start: int, final: int, capacity: int, layers: int,
                chunk: int) -> tuple[float, float]:
    """:func:`grow` in this process from a cache of ``capacity`` columns, its buffers zeroed whole at reset
    (as up to session 29) or as the width reaches them. Returns (seconds, peak MB above the RSS before)."""
    torch.set_num_threads(1)
    before = resident_bytes()
    cache = KVCache(capacity=capacity)
    t0 = time.perf_counter()
    for _ in range(layers):
        layer = cache.layer_class_to_replicate()
        states = torch.ones(rows, HEADS, 1, DIM, dtype=torch.bfloat16)
        layer.lazy_initialization(states, states)
        if zero_at_reset:
            layer.make_room(capacity)
        cache.layers.append(layer)
    for width in (start, *range(start + chunk, final + 1, chunk)):
        n = start if width == start else chunk
        cache.prepare(torch.arange(width - n, width)[None].expand(rows, n), width)
        states = torch.ones(rows, HEADS, n, DIM, dtype=torch.bfloat16)
        for layer in cache.layers:
            layer.update(states, states)
    return time.perf_counter() - t0, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before) / 2**20


def _in_fresh_process(*spec) -> tuple[float, float]:
    """:func:`grow_memory` in a new interpreter (this file with ``--memory-child``), so each peak starts clean."""
    done = subprocess.run([sys.executable, __file__, "--memory-child", json.dumps(spec)], capture_output=True,
                          text=True, check=True)
    seconds, peak = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, peak


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=48)
    p.add_argument("--keep", type=int, default=24, help="rows kept (every other one, in order)")
    p.add_argument("--capacity", type=int, default=2048)
    p.add_argument("--width", type=int, default=1500, help="columns in use")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--grow-rows", type=int, default=32)
    p.add_argument("--grow-from", type=int, default=700, help="the rows' starting context, tokens")
    p.add_argument("--grow-to", type=int, default=2000, help="columns the rows reach")
    p.add_argument("--budget", type=int, default=2048, help="rollout.context_budget")
    p.add_argument("--chunk", type=int, default=16, help="columns written a step")
    p.add_argument("--mem-to", type=int, default=1000, help="columns the rows reach in the memory comparison")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)  # one grow_memory run, its result as JSON
    args = p.parse_args(argv)
    if args.memory_child:
        print(json.dumps(grow_memory(*json.loads(args.memory_child))))
        return
    if args.quick:
        args.rows, args.keep, args.capacity, args.width, args.layers, args.repeats = 8, 4, 256, 200, 2, 1
        args.grow_rows, args.grow_from, args.grow_to, args.budget, args.chunk = 4, 100, 500, 512, 50
        args.mem_to = 200
    rows = list(range(0, args.rows, max(1, args.rows // args.keep)))[: args.keep]
    mb = args.layers * 2 * args.rows * HEADS * args.capacity * DIM * 2 / 2**20
    times: dict[str, list[float]] = {"new buffer (before)": [], "in place (now)": []}
    for _ in range(args.repeats):
        for name, fn in (("new buffer (before)", compact_new_buffer), ("in place (now)", compact_in_place)):
            cache = make_cache(args.rows, args.capacity, args.layers)
            t0 = time.perf_counter()
            fn(cache, rows, args.width)
            times[name].append(time.perf_counter() - t0)
            del cache
    best = {k: min(v) for k, v in times.items()}
    layer_mb, fresh, touched = fresh_against_touched(args.rows, args.capacity, args.repeats)
    print(f"one layer's keys, {layer_mb:.1f} MB: new_zeros {fresh * 1000:.1f} ms ({fresh * 1000 / layer_mb:.2f} ms a MB), "
          f"copy into touched memory {touched * 1000:.1f} ms")
    print(f"KV cache {args.rows} rows x {args.capacity} columns x {args.layers} layers ({mb:.0f} MB), "
          f"keep {len(rows)} rows of {args.width} columns; torch threads {torch.get_num_threads()}; "
          f"best of {args.repeats}")
    for k, v in best.items():
        print(f"  {k}: {v * 1000:.1f} ms")
    print(f"  ratio before / now: {best['new buffer (before)'] / max(best['in place (now)'], 1e-9):.1f}x")

    sizing = {"doubling from the longest context + 256 (before)": args.grow_from + 256,
              f"the budget, {args.budget} columns, at reset (now)": args.budget}
    grown: dict[str, list[float]] = {k: [] for k in sizing}
    cols: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, cap in sizing.items():
            secs, cols[name] = grow(args.grow_rows, args.grow_from, args.grow_to, cap, args.layers, args.chunk)
            grown[name].append(secs)
    print(f"rows growing {args.grow_rows} x {args.grow_from} -> {args.grow_to} columns, {args.chunk} a step, "
          f"{args.layers} layers; best of {args.repeats}")
    for name, v in grown.items():
        print(f"  {name}: {min(v) * 1000:.1f} ms, {cols[name]} columns at the end")
    g = [min(v) for v in grown.values()]
    print(f"  growth ratio before / now: {g[0] / max(g[1], 1e-9):.2f}x")

    mem_rows = 32 if not args.quick else args.grow_rows
    mem_from = min(700, args.mem_to) if not args.quick else args.grow_from
    used = args.layers * 2 * mem_rows * HEADS * args.mem_to * DIM * 2 / 2**20
    reserved = args.layers * 2 * mem_rows * HEADS * args.budget * DIM * 2 / 2**20
    print(f"memory: {mem_rows} rows {mem_from} -> {args.mem_to} columns of a {args.budget}-column cache, "
          f"{args.layers} layers ({used:.0f} MB used, {reserved:.0f} MB reserved); a fresh process each, best of {args.repeats}")
    peaks: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.repeats):
        for name, whole in (("zeroed whole at reset (before)", True), ("zeroed as the width reaches it (now)", False)):
            peaks.setdefault(name, []).append(_in_fresh_process(whole, mem_rows, mem_from, args.mem_to,
                                                                args.budget, args.layers, args.chunk))
    for name, v in peaks.items():
        print(f"  {name}: peak +{min(m for _, m in v):.0f} MB, {min(t for t, _ in v) * 1000:.1f} ms")
    m = [min(x for _, x in v) for v in peaks.values()]
    print(f"  memory ratio before / now: {m[0] / max(m[1], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
