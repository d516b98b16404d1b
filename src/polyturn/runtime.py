"""One device and one precision for a whole run, chosen once at load (as nanoGPT does).

``run.device`` (``auto | cpu | cuda | cuda:N | mps``) says where the actor,
the critic, their target copies, the KL reference, the KV caches and every
batch live; ``run.precision`` (``fp32 | bf16 | fp16``) says how forward passes
run: :meth:`Runtime.autocast` wraps them in ``torch.autocast`` and the master
weights stay float32, so log-softmax, GAE and every loss are computed in fp32
(the callers cast logits with ``.float()``). fp16 also needs a gradient
scaler (:meth:`Runtime.grad_scaler`); bf16 does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import platform
import sys
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal

import torch

Precision = Literal["fp32", "bf16", "fp16"]
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(spec: str, name: str = "run.device") -> torch.device:
    """``auto`` -> CUDA when present, else MPS when present, else CPU; anything else is checked to exist (errors
    name the setting ``name``: the config field, or a command's flag)."""
    spec = spec.strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"{name}: expected auto, cpu, cuda, cuda:N or mps, got {spec!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} = {spec!r} but this torch build sees no CUDA GPU; use {name}=cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name} = {spec!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name} = {spec!r} but MPS is not available here; use {name}=cpu or auto")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{name}: expected auto, cpu, cuda, cuda:N or mps, got {spec!r}")
    return dev


@dataclass(frozen=True)
class Runtime:
    """Where tensors live and how forward passes compute."""

    device: torch.device = torch.device("cpu")
    precision: Precision = "fp32"

    @classmethod
    def from_config(cls, device: str, precision: Precision, *, names: tuple[str, str] = ("run.device", "run.precision"),
                    ) -> Runtime:
        """Resolve ``run.device`` / ``run.precision`` (errors name the setting, ``names``: the config fields or a
        command's flags, and the fix)."""
        dname, pname = names
        if precision not in DTYPES:
            raise ValueError(f"{pname}: expected fp32, bf16 or fp16, got {precision!r}")
        dev = resolve_device(device, dname)
        if precision == "fp16" and dev.type == "cpu":
            raise ValueError(f"{pname} = fp16 is not supported on the CPU; use bf16 or fp32 there")
        if precision == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(f"{pname} = bf16 but this GPU has no bf16 support; use fp16 or fp32")
        return cls(device=dev, precision=precision)

    @property
    def emulated_bf16(self) -> bool:
        """bf16 on a CPU without AVX-512 (or Arm SVE): its matrix products are emulated.

        Measured on an AVX2-only 2-core EPYC (2026-12-02): a 1024 x 576 -> 1536 linear forward and backward in
        bf16 autocast took 5.15 s against 0.19 s in fp32 (27x); a SmolLM2 BC step went from minutes to over 30.
        """
        if self.precision != "bf16" or self.device.type != "cpu":
            return False
        return torch.backends.cpu.get_cpu_capability() not in ("AVX512", "SVE", "SVE256", "SVE512")

    @property
    def dtype(self) -> torch.dtype:
        """The forward passes' compute dtype."""
        return DTYPES[self.precision]

    def autocast(self) -> AbstractContextManager:
        """``torch.autocast`` for this device and precision (a no-op context for fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A gradient scaler for fp16 (small gradients underflow in fp16); None otherwise."""
        if self.precision != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type)

    def generator(self, seed: int) -> torch.Generator:
        """A seeded generator on this device (sampling draws on the device the logits are on)."""
        return torch.Generator(device=self.device).manual_seed(seed)


CPU = Runtime()


def machine(device: torch.device | None = None, **threads: int) -> dict[str, object]:
    """What a run's wall times were measured on: the CPU's model and the instruction set torch dispatches to
    (``AVX2`` / ``AVX512`` / ...: bf16 is emulated below AVX-512), the cores this process may use, torch's
    version, the GPU when ``device`` is one, and ``threads`` as given (the run's ``rollout_threads`` and
    ``train_threads``). Written into every run's ``summary.json``: the same command's wall time has differed 2.7x
    between machines of this project, so a timing names its machine."""
    info: dict[str, object] = {
        "cpu": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        **threads,
    }
    if device is not None and device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def describe_machine(m: dict) -> str:
    """One line for :func:`machine`'s record (as a run's ``summary.json`` keeps it): ``AMD EPYC (AVX2, 2 cores;
    torch threads 1 sampling, 2 training)``, then the GPU if any; the parts a record lacks are left out."""
    text = ", ".join(str(x) for x in (m.get("cpu_capability"), m.get("cores") and f"{m['cores']} cores") if x)
    if m.get("rollout_threads") and m.get("train_threads"):
        text += f"; torch threads {m['rollout_threads']} sampling, {m['train_threads']} training"
    return (f"{m.get('cpu', 'unknown CPU')}" + (f" ({text})" if text else "")
            + (f", GPU {m['gpu']}" if m.get("gpu") else ""))


def _cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else :func:`platform.processor`, else ``unknown``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux ``/proc/self/statm``); None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _glibc_malloc_trim():
    """glibc's ``malloc_trim`` (None on other C libraries and systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # musl has none
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_MALLOC_TRIM = _glibc_malloc_trim()


def release_host_memory() -> int:
    """Collect Python's garbage and hand the C heap's free pages back to the OS; returns the bytes of resident
    memory released (0 where it cannot be measured).

    On the CPU torch takes its tensors from the C allocator, and glibc serves every allocation under its
    mmap threshold (which rises to 32 MB as large blocks are freed) from a heap that only returns memory from
    its top: the free space left between live blocks stays resident. ``malloc_trim(0)`` releases those pages
    (it is a no-op elsewhere).
    """
    before = resident_bytes()
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    after = resident_bytes()
    return max(0, before - after) if before is not None and after is not None else 0


@contextlib.contextmanager
def long_lived_frozen():
    """Collect once, then leave every object alive now out of the garbage collector's walks until the block ends.

    A full collection walks every tracked object: in a process that has imported torch and transformers that is
    0.6-0.9 s (2026-12-07, 560-740 thousand objects, AVX2 EPYC), paid by every evaluation's
    :func:`release_host_memory`. Frozen, the models, tokenizers and env data set up before a run (and what its
    earlier phases kept) are no longer walked; what the block makes is collected as usual. Nested blocks freeze more
    and the outermost one's end unfreezes all (``gc.unfreeze`` has no partial form).
    """
    outer = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()
