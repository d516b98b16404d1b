"""Sampling one token per row: ``torch.multinomial`` against polyturn's two-level inverse-CDF sampler.

``torch.multinomial`` draws an exponential number for every vocabulary entry; ``sample_categorical``
draws one uniform number per row. Side by side, one thread, 64 rows, the demo's vocabulary (2,048) and
SmolLM2's (49,152)::

    .venv/bin/python benchmarks/sampler.py
    .venv/bin/python benchmarks/sampler.py --quick   # 0.05 s per side: checks that it runs, nothing more
"""

from __future__ import annotations

import argparse
import time

import torch

from polyturn.rollout.generate import sample_categorical


def per_call_ms(fn, seconds: float = 1.0) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return 1e3 * (time.perf_counter() - t0) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="time each side for 0.05 s instead of 1 s")
    args = p.parse_args()
    seconds = 0.05 if args.quick else 1.0
    torch.set_num_threads(1)
    print("| vocabulary | rows | torch.multinomial (ms) | sample_categorical (ms) | ratio |")
    print("|---|---|---|---|---|")
    for vocab in (2048, 49152):
        probs = torch.softmax(3 * torch.randn(64, vocab), -1)
        g = torch.Generator().manual_seed(0)
        a = per_call_ms(lambda: torch.multinomial(probs, 1, generator=g), seconds)
        b = per_call_ms(lambda: sample_categorical(probs, generator=g), seconds)
        print(f"| {vocab} | 64 | {a:.2f} | {b:.2f} | {a / b:.0f}x |")


if __name__ == "__main__":
    main()
