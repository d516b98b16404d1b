"""Tokenizer training speed: time to train a byte-level BPE tokenizer on about a megabyte of text.

A wall-clock limit inside a unit test flakes on a shared machine, so the
timing lives here. Run by hand::

    .venv/bin/python benchmarks/tokenizer.py            # word BPE, vocabulary 2,048
    .venv/bin/python benchmarks/tokenizer.py --phrase   # phrase BPE (the tiny preset's kind)
    .venv/bin/python benchmarks/tokenizer.py --quick    # 300 lines, vocabulary 512, one run: that it runs
"""

from __future__ import annotations

import argparse
import random
import time

from polyturn.models.tokenizer import train_tokenizer

WORDS = ["SELECT", "FROM", "WHERE", "orders", "amount", "users", "查询", "订单", "金额", "Action:", "2024"]


def corpus(n: int, seed: int = 1) -> list[str]:
    """``n`` lines of SQL-like text with Chinese words and numbers (the unit tests' corpus, larger)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(30)) + f" id = {rng.randint(0, 99999)}" for _ in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=6000, help="corpus lines (6,000 is about 1.1 MB)")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--phrase", action="store_true", help="phrase BPE: merges across spaces, tokens up to 24 chars")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="300 lines, vocabulary 512, one run")
    args = p.parse_args()
    if args.quick:
        args.lines, args.vocab, args.repeats = 300, 512, 1
    texts = corpus(args.lines)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        tok = train_tokenizer(texts, vocab_size=args.vocab, split_words=not args.phrase,
                              max_token_length=24 if args.phrase else None)
        times.append(time.perf_counter() - start)
        assert tok.decode(tok(texts[0])["input_ids"]) == texts[0]
    kind = "phrase" if args.phrase else "word"
    print(f"{kind} BPE, vocabulary {args.vocab}, {mb:.2f} MB: best {min(times):.2f} s, "
          f"median {sorted(times)[len(times) // 2]:.2f} s over {args.repeats} runs")


if __name__ == "__main__":
    main()
