"""SmolLM2 with configs/sql_smollm2.yaml's LoRA under bf16 autocast: the frozen base kept in float32 (autocast
casts it on every call) vs stored in bf16 (`polyturn.models.actor.store_frozen_linears`), side by side.

Prints, for each: a prefill of 32 rows of 64 tokens, a decoding step of 32 rows, and a training forward +
backward of 4 x 256 tokens (best of 3). Run: `taskset -c 1 .venv/bin/python benchmarks/frozen_bf16.py`
(about 2 minutes, one thread). ``--quick`` measures the final actor of ``benchmarks/quick.py``'s tiny run under
the same LoRA instead, at 4 rows and one training step: that it runs.
"""

from __future__ import annotations

import argparse
import time

import torch

from polyturn.cli import _quiet_libraries
from polyturn.models.actor import Actor, pretrained_actor, store_frozen_linears
from polyturn.rollout.generate import BatchDecoder
from polyturn.runtime import Runtime

LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def measure(actor: Actor, name: str, rows: int = 32, steps: int = 3) -> None:
    """Print prefill, decode-step and training-step times of ``actor`` as it is stored now."""
    prefixes = [actor.encode(actor.chat.render_prefix(f"Which product had the highest revenue in zone {i}? " * 3,
                                                      None)) for i in range(rows)]
    action = actor.encode("Thought: look.\nAction: list_tables[{}]")[:11] + [actor.stop_id]
    ids = torch.tensor([sum(prefixes[:4], [])[:256]] * 4)
    dec = BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id, autocast=actor.autocast)
    actor.model.eval()
    with torch.no_grad():
        t0 = time.perf_counter()
        dec.reset([list(p) for p in prefixes])
        t1 = time.perf_counter()
        dec.sample(active=[True] * rows, temperature=1.0, max_new_tokens=len(action), forced=[action] * rows,
                   generator=torch.Generator().manual_seed(0))
        t2 = time.perf_counter()
    actor.model.train()
    times = []
    for _ in range(steps):
        t3 = time.perf_counter()
        hidden = actor.hidden_states(ids, torch.ones_like(ids))
        actor.head(hidden[:, -64:]).float().logsumexp(-1).mean().backward()
        times.append(time.perf_counter() - t3)
    print(f"{name}: prefill {len(prefixes[0])} tokens x {rows} rows {t1 - t0:.2f} s; decoding "
          f"{(t2 - t1) / len(action) * 1e3:.0f} ms per step; training forward+backward 4 x 256 tokens "
          f"{min(times):.2f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="the tiny actor of benchmarks/quick.py instead of SmolLM2, 4 rows, one training step")
    args = p.parse_args()
    _quiet_libraries()
    torch.set_num_threads(1)
    if args.quick:
        from quick import tiny_run

        actor = pretrained_actor("local", path=str(tiny_run() / "ckpt-final" / "actor"), lora=LORA)
    else:
        actor = pretrained_actor("smollm2-135m", lora=LORA)
    size = {"rows": 4, "steps": 1} if args.quick else {}
    actor.runtime = Runtime(precision="bf16")  # autocast, weights untouched (float32)
    measure(actor, "frozen base in float32, cast on every call", **size)
    n = store_frozen_linears(actor.model, torch.bfloat16)
    measure(actor, f"frozen base stored in bf16 ({n} tensors)", **size)


if __name__ == "__main__":
    main()
