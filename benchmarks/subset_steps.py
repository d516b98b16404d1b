"""Decode steps that run a few of the decoder's rows, every row opening with the shared prefix (a system prompt):
the cache handing the attention only the running rows' columns after the prefix (``BatchDecoder.slice_prefix``,
since 2026-12-08) against every column, as before, side by side in one process.

The multi-role collector (self-play, hierarchy) decodes each role's rows in its own round, so most of its steps
run a subset of a decoder's rows; such a step gathers the running rows' keys and values from the cache. A py-spy
profile of the hierarchical SmolLM2 run's held-out evaluation (runs/cs_hier_smol_s1, 90 s, 2026-12-08) put 17% of
its samples in that gather and most of the rest of the attention in copying the gathered rows' own columns again.

SmolLM2-135M-Instruct with the LoRA adapters of configs/customer_service_smollm2.yaml, bf16, ``--rows`` rows of a
``--prefix``-token shared prefix and ~``--own`` tokens of their own (random ids; the cost does not depend on them),
each step one new token for ``r`` of the rows; arms alternate, ``--repeats`` rounds of ``--steps`` steps, the median
step time of each::

    taskset -c 1 .venv/bin/python benchmarks/subset_steps.py --threads 1
    .venv/bin/python benchmarks/subset_steps.py --quick     # the tiny preset: that it runs, not a measurement
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from polyturn.cli import _quiet_libraries
from polyturn.models.actor import Actor, pretrained_actor, tiny_actor
from polyturn.rollout.generate import BatchDecoder
from polyturn.runtime import Runtime

LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def decoder(actor: Actor, rows: int, prefix: int, own: int, seed: int) -> BatchDecoder:
    g = torch.Generator().manual_seed(seed)
    vocab = actor.model.config.vocab_size
    shared = torch.randint(3, vocab, (prefix,), generator=g).tolist()
    contexts = [shared + torch.randint(3, vocab, (own + (37 * i) % 200 - 100,), generator=g).tolist()
                for i in range(rows)]
    dec = BatchDecoder(actor.model, pad_id=actor.pad_id, stop_id=actor.stop_id, autocast=actor.autocast,
                       capacity=prefix + own + 512)
    dec.reset(contexts)
    return dec


@torch.no_grad()
def step_ms(dec: BatchDecoder, running: list[int], steps: int) -> float:
    """Median ms of ``steps`` decode steps of one new token for each row in ``running``."""
    b = len(dec.lengths)
    counts = [1 if i in running else 0 for i in range(b)]
    times = []
    for _ in range(steps):
        tokens = dec.last_logits.argmax(-1)[:, None]
        t = time.perf_counter()
        dec._forward(tokens, counts)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=48, help="the decoder's rows (rollout.num_envs)")
    p.add_argument("--running", type=int, nargs="+", default=[4, 16, 24], help="rows a step runs")
    p.add_argument("--prefix", type=int, default=702, help="shared prefix tokens (CustomerService's system prompt)")
    p.add_argument("--own", type=int, default=800, help="each row's own tokens after it, about")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if not all(1 <= r <= args.rows for r in args.running):
        p.error(f"--running takes row counts from 1 to --rows ({args.rows}), got {args.running}")
    _quiet_libraries()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        from polyturn.models.chat import SIMPLE_SPECIAL_TOKENS
        from polyturn.models.tokenizer import train_tokenizer

        tok = train_tokenizer(["select name from users where id = 1"] * 20, vocab_size=300,
                              special_tokens=SIMPLE_SPECIAL_TOKENS)
        actor = tiny_actor(tok, hidden=64, layers=2, heads=4, kv_heads=2)
        args.rows, args.running, args.prefix, args.own, args.steps, args.repeats = 8, [2], 64, 120, 2, 1
        runtime = Runtime.from_config("cpu", "fp32")
    else:
        actor = pretrained_actor("smollm2-135m", lora=LORA)
        runtime = Runtime.from_config("cpu", "bf16")
    actor.to(runtime)
    actor.model.eval()
    dec = decoder(actor, args.rows, args.prefix, args.own, seed=0)
    print(f"{args.rows} rows, shared prefix {args.prefix} tokens, widths {min(dec.lengths)}-{max(dec.lengths)}; "
          f"{torch.get_num_threads()} thread(s); median ms a decode step")
    for r in args.running:
        running = list(range(0, args.rows, max(1, args.rows // r)))[:r]  # spread over the batch
        got: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for sliced in (False, True):
                dec.slice_prefix = sliced
                got[sliced].append(step_ms(dec, running, args.steps))
        before, now = statistics.median(got[False]), statistics.median(got[True])
        print(f"  {r:>3} of {args.rows} rows running: every column {before:8.1f} ms   own columns {now:8.1f} ms   "
              f"{before / now:5.2f}x")


if __name__ == "__main__":
    main()
