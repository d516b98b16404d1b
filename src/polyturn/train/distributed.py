"""Data-parallel training under ``torchrun`` (``polyturn train --nproc K``): gloo on CPU, nccl on GPU.

Every process holds the whole model and plays ``1/K`` of each iteration's tasks; the episodes are then
all-gathered, so every process sees the same global batch (same advantages, same minibatch shuffles,
same early stops). Each minibatch's micro-batches are shared out (micro-batch ``j`` on rank ``j % K``),
each loss keeps its share of the *global* minibatch, and the gradients are summed across processes
before clipping: the step is the one-process step on the same batch, up to float summation order
(tested). Rank 0 writes checkpoints, logs and evaluation files; the other ranks log under
``out_dir/rank<r>/``. A checkpoint holds no process count, so a run resumes on any number of them.

Outside ``torchrun`` (no ``WORLD_SIZE``) nothing here does anything: one process, today's path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def active() -> bool:
    """Running as one of several processes of an initialised process group."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def setup(device: str) -> bool:
    """Join the process group that ``torchrun`` describes (``WORLD_SIZE`` > 1); returns whether one was joined.

    The backend is nccl when the run's device is CUDA, gloo otherwise. Each process takes the GPU of its
    ``LOCAL_RANK`` (so ``run.device: cuda`` means a different GPU per process).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return active()
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    return True


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items`` (every ``K``-th from its rank); all of them in one process."""
    return list(items)[rank() :: world_size()] if active() else list(items)


def gather_in_order(local: Sequence[T]) -> list[T]:
    """Undo :func:`shard`: every rank's items, interleaved back into the order they were sharded from."""
    if not active():
        return list(local)
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, list(local))
    out: list[T] = []
    for i in range(max(len(p) for p in parts)):
        out += [p[i] for p in parts if i < len(p)]
    return out


def sum_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over the processes (in one flat buffer; a missing gradient counts as 0)."""
    if not active():
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any process (one collective; ``flag`` itself alone), so that every process
    takes the same branch: one rank's non-finite loss must stop the step on all of them, or the others would
    wait forever in the gradient all-reduce."""
    if not active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t)
    return bool(t.item() > 0)


def barrier() -> None:
    """Wait until every process gets here (nothing in one process)."""
    if active():
        dist.barrier()


def sum_stats(sums: dict[str, Any]) -> dict[str, float]:
    """Sum per-rank statistic sums (keys may differ: a rank with no micro-batch of a minibatch has none)."""
    local = {k: float(v) for k, v in sums.items()}
    if not active():
        return local
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, local)
    out: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


def close() -> None:
    """Leave the process group (the end of a run)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
