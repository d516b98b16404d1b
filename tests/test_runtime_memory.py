"""release_host_memory hands the C heap's free pages back to the OS (glibc); resident_bytes reads them."""

from __future__ import annotations

import pytest
import torch

from polyturn import runtime
from polyturn.runtime import release_host_memory, resident_bytes

pytestmark = pytest.mark.skipif(runtime._MALLOC_TRIM is None or resident_bytes() is None, reason="glibc on Linux only")


def _free_between_live_blocks() -> list[torch.Tensor]:
    """Free 4,900 of 5,000 tensors of 64 KiB (306 MiB; under glibc's mmap threshold, so from the heap), keeping
    every 50th: the kept ones pin the freed space between them, which free() alone does not hand back."""
    blocks = [torch.ones(16384) for _ in range(5000)]
    kept = blocks[::50]
    del blocks
    return kept


def test_freed_heap_blocks_between_live_ones_are_released():
    kept = _free_between_live_blocks()
    held = resident_bytes()
    released = release_host_memory()
    assert released > 150 * 2**20, released / 2**20
    assert resident_bytes() < held - 150 * 2**20
    assert all(float(t.sum()) == 16384 for t in kept)  # the live blocks are untouched


def test_without_the_trim_the_freed_blocks_stay_resident(monkeypatch):
    monkeypatch.setattr(runtime, "_MALLOC_TRIM", None)
    kept = _free_between_live_blocks()
    assert release_host_memory() < 100 * 2**20  # garbage collection alone hands back next to nothing
    assert len(kept) == 100
