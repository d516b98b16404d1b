"""release_host_memory hands the C heap's free pages back to the OS (glibc); resident_bytes reads them."""

from __future__ import annotations

import pytest
import torch

from polyturn import runtime
from polyturn.runtime import release_host_memory, resident_bytes


@pytest.mark.skipif(runtime._MALLOC_TRIM is None or resident_bytes() is None, reason="glibc on Linux only")
def test_freed_heap_blocks_between_live_ones_are_released():
    # 64 KiB tensors come from the heap (under glibc's mmap threshold); keeping every 50th pins the freed ones
    # between them, so freeing alone returns (almost) nothing and the trim returns most of it.
    blocks = [torch.ones(16384) for _ in range(5000)]  # 312 MiB
    kept = blocks[::50]
    del blocks
    held = resident_bytes()
    released = release_host_memory()
    assert released > 150 * 2**20, released / 2**20
    assert resident_bytes() < held - 150 * 2**20
    assert all(float(t.sum()) == 16384 for t in kept)  # the live blocks are untouched


def test_release_is_harmless_without_glibc(monkeypatch):
    monkeypatch.setattr(runtime, "_MALLOC_TRIM", None)
    assert release_host_memory() >= 0
