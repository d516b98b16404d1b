"""SmolLM2-135M-Instruct as the LLM judge, against the env's outcome (issue 57; docs/judge.md, "Measured").

Serves the model with vLLM's OpenAI-compatible server (``make vllm-venv``; the float32 Hugging Face copy polyturn
keeps of the shipped GGUF weights), judges every episode of each ``--data`` file with each ``--scoring`` through the
real ``openai`` client (polyturn's judge: the env's rubric, the env's answer to the last action hidden), and prints,
per file and scoring, how many replies were malformed and the agreement of the score with the known outcome:
accuracy (s >= 0.5 read as success), AUC and Spearman. Verdicts are cached under ``--out``, so a rerun sends only
what is missing.

    make vllm-venv
    polyturn demos --env polyturn/SQLAnalyst-v0 --episodes 200 --noise 0.5 --seed 7000 \
        --out runs/judge/SQLAnalyst_200.jsonl
    python benchmarks/judge_agreement.py --data runs/judge/SQLAnalyst_200.jsonl --out runs/judge
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from polyturn.acting.jsonl import read_jsonl
from polyturn.acting.judge import JudgeCache, agreement, chat_completion, judge_records, outcome_known
from polyturn.models.actor import smollm2_base, smollm2_cache_dir
from polyturn.rollout.vllm_server import VLLMServer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", required=True, help="episode JSONL files with known outcomes")
    p.add_argument("--scoring", nargs="+", default=["yes_no", "score"], choices=("yes_no", "score"))
    p.add_argument("--out", default="runs/judge", help="where the verdict caches go")
    p.add_argument("--threads", type=int, default=1, help="the vLLM server's CPU threads")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256, help="longest reply under --scoring score")
    p.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="judge through this OpenAI-compatible server instead of starting vLLM on SmolLM2")
    p.add_argument("--model", default=None, help="with --endpoint: the model's name there")
    args = p.parse_args(argv)
    if args.endpoint and not args.model:
        p.error("--endpoint needs --model")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.endpoint:
        measure(args, args.endpoint, args.model, out)
        return 0
    model_dir = smollm2_cache_dir()
    if not (model_dir / "config.json").is_file():
        smollm2_base()  # writes the float32 copy once (~40 s)
    with VLLMServer(model_dir, python=args.vllm_python, dtype="float32", max_model_len=4096, threads=args.threads,
                    compile=False, log_path=out / "vllm-judge.log") as srv:
        print(f"vLLM server up in {srv.startup_s:.1f} s ({model_dir})", flush=True)
        measure(args, srv.base_url + "/v1", srv.served, out, name="SmolLM2-135M-Instruct")
    return 0


def measure(args: argparse.Namespace, endpoint: str, served: str, out: Path, name: str | None = None) -> None:
    """Judge every file with every scoring through ``endpoint``; print a row each and the table."""
    rows = []
    for path in args.data:
        records = [r for r in read_jsonl(path) if r.get("turns") and outcome_known(r)]
        for scoring in args.scoring:
            ask = chat_completion(served, base_url=endpoint, timeout=600, max_retries=1,
                                  scoring=scoring, max_tokens=args.max_tokens)
            cache = JudgeCache(out / f"{Path(path).stem}.{scoring}.judge-cache.jsonl")
            t0 = time.perf_counter()
            verdicts = judge_records(records, ask, model=name or served, cache=cache,
                                     concurrency=args.concurrency, on_malformed="record", scoring=scoring)
            wall = time.perf_counter() - t0
            pairs = [(v.value, bool(r.get("success"))) for v, r in zip(verdicts, records) if v.value is not None]
            a = agreement([s for s, _ in pairs], [ok for _, ok in pairs])
            bad = [v for v in verdicts if v.value is None]
            rows.append((Path(path).stem, scoring, len(records), sum(r.get("success", False) for r in records),
                         len(bad), statistics.fmean(s for s, _ in pairs) if pairs else None, a, wall))
            if bad:
                print(f"  {Path(path).stem} {scoring}: first malformed reply ends {bad[0].reply[-120:]!r}")
            print(_row(rows[-1]), flush=True)
    print("\nfile | scoring | episodes (successes) | malformed | mean s | accuracy | AUC | Spearman | wall s")
    for row in rows:
        print(_row(row))


def _row(row: tuple) -> str:
    name, scoring, n, succ, bad, mean, a, wall = row

    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    return (f"{name} | {scoring} | {n} ({succ}) | {bad} | {f(mean)} | {f(a['accuracy'])} | {f(a['auc'])} | "
            f"{f(a['spearman'])} | {wall:.0f}")


if __name__ == "__main__":
    sys.exit(main())
