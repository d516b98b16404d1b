"""``polyturn judge``: score recorded episodes with an LLM judge behind an OpenAI-compatible endpoint.

Writes the records again with ``judge`` (the score in [0, 1]), ``judge_score`` (1-10) and ``judge_model`` (or, for a
malformed reply under ``--on_malformed record``, ``judge_error`` and the reply's end in ``judge_reply``); offline
training reads the score as the return of an episode with no known outcome (``offline.judge``, docs/judge.md). Verdicts go to a cache file as they arrive, so
a rerun (after a malformed reply, a server that went away, Ctrl-C) sends only the episodes still unjudged.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from polyturn.acting.judge import JUDGE_FIELDS, JudgeCache, agreement, chat_completion, judge_records, outcome_known
from polyturn.acting.jsonl import RECORD_FILE, read_episode_records, write_jsonl
from polyturn.console import RichReporter


def default_cache(out: str | Path) -> Path:
    """``judged.jsonl`` -> ``judged.judge-cache.jsonl``, beside the output."""
    out = Path(out)
    return out.with_name(out.stem + ".judge-cache.jsonl")


def read_episodes(paths: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every record of ``paths`` and a name for each (file, line, task, session) for error messages."""
    records, names = [], []
    for path in paths:
        for k, rec in enumerate(read_episode_records(path, missing="an episode JSONL file (`polyturn serve --record "
                                                                   f"DIR` writes DIR/{RECORD_FILE})")):
            records.append(rec)
            names.append(f"the episode at {path}:{k + 1} (task {rec.get('task_id')!r}"
                         + (f", session {rec['session_id']}" if rec.get("session_id") else "") + ")")
    return records, names


def run(args: argparse.Namespace) -> int:
    """Judge every episode of ``--data``; write them with their scores to ``--out``; print the judge's agreement
    with the outcomes that are known."""
    console = Console(stderr=True)
    if Path(args.out).resolve() in {Path(p).resolve() for p in args.data}:
        raise ValueError(f"Expected --out other than a --data file, got {args.out}: write the judged records to a "
                         "new file")
    records, names = read_episodes(args.data)
    judged = [i for i, r in enumerate(records) if r["turns"] and not r.get("crashed")]
    cache = JudgeCache(args.cache or default_cache(args.out))
    ask = chat_completion(args.model, base_url=args.endpoint, timeout=args.timeout, max_retries=args.retries,
                          scoring=args.scoring, max_tokens=args.max_tokens)
    rep = RichReporter(console)
    rep.start(f"judging with {args.model}", len(judged))
    try:
        verdicts = judge_records([records[i] for i in judged], ask, model=args.model, cache=cache,
                                 names=[names[i] for i in judged], concurrency=args.concurrency, progress=rep.advance,
                                 on_malformed=args.on_malformed, scoring=args.scoring)
    except ValueError as e:
        raise ValueError(f"{e} ({len(cache)} verdicts kept in {cache.path}: a rerun sends only the rest)") from None
    finally:
        rep.close()
    for i, v in zip(judged, verdicts):
        fields = ({"judge_error": v.error, "judge_reply": v.reply[-2000:]} if v.score is None
                  else {"judge": round(v.value, 6), "judge_score": v.score})
        kept = {k: v for k, v in records[i].items() if k not in JUDGE_FIELDS}  # a judged file judged again
        records[i] = {**kept, **fields, "judge_model": args.model}
    write_jsonl(args.out, records)
    scored = [v for v in verdicts if v.score is not None]
    sent = sum(not v.cached for v in verdicts)
    mean = sum(v.score for v in scored) / max(1, len(scored))
    console.print(escape(f"judged {len(scored)} episodes ({len(verdicts) - sent} from {cache.path}, {sent} sent): "
                         f"mean score {mean:.2f} of 10; wrote {args.out}")
                  + (f" ({len(records) - len(judged)} records without turns left unjudged)"
                     if len(judged) < len(records) else ""), highlight=False)
    if len(scored) < len(verdicts):
        console.print(f"[yellow]{len(verdicts) - len(scored)} malformed replies[/yellow] recorded as judge_error "
                      "(no score; offline training reads those episodes as unjudged); a rerun asks again")
    known = [i for i in judged if outcome_known(records[i]) and "judge" in records[i]]
    a = agreement([records[i]["judge"] for i in known], [bool(records[i].get("success")) for i in known])
    if a["auc"] is None:
        console.print(f"agreement with the outcome: not measured ({a['n']} judged episodes with a known outcome, "
                      f"{a['successes']} successes: it needs both)")
    else:
        rho = "n/a" if a["spearman"] is None else f"{a['spearman']:.3f}"
        console.print(f"agreement with the outcome on {a['n']} episodes ({a['successes']} successes): accuracy "
                      f"{a['accuracy']:.3f} (score >= 0.5 read as success), AUC {a['auc']:.3f}, Spearman {rho}")
    return 0
