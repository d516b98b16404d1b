"""Pairwise preference between two policies (seed 001, 5.1 "human preference").

Both sides ran the same test cases (``polyturn evaluate`` output directories,
or episode JSONL files); :func:`make_pairs` matches their episodes by test
case and decides, with a seeded RNG, which side is shown on the left. A rater
(a person through :mod:`polyturn.eval.rate_server`, an LLM judge through
:func:`judge_pairs`, or the offline :func:`heuristic_judge_pairs`) picks
left / right / tie, and each choice becomes a rating record that keeps the
true identity of both sides.

:func:`win_rate` summarises ratings: A's win rate counts a tie as half a win,
``(wins_A + ties / 2) / n``, with a 95% **Wilson** interval on that score
(each comparison one trial; with ties the true variance is lower than a
Bernoulli's, so the interval is slightly conservative).
"""

from __future__ import annotations

import datetime as _dt
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from polyturn.acting.judge import chat_completion
from polyturn.acting.jsonl import read_jsonl
from polyturn.envs.spec import EnvSpec
from polyturn.eval import records as R
from polyturn.eval.stats import wilson_interval

Choice = Literal["left", "right", "tie"]


@dataclass(frozen=True)
class Pair:
    """Two episodes of the same test case; ``left`` says which side (``"A"``/``"B"``) is shown left."""

    index: int
    key: str
    a: dict[str, Any]
    b: dict[str, Any]
    a_name: str
    b_name: str
    left: Literal["A", "B"]

    @property
    def left_record(self) -> dict[str, Any]:
        """The episode shown on the left."""
        return self.a if self.left == "A" else self.b

    @property
    def right_record(self) -> dict[str, Any]:
        """The episode shown on the right."""
        return self.b if self.left == "A" else self.a


def load_side(path: str | Path) -> tuple[str, list[dict[str, Any]]]:
    """``(name, records)`` of one side: an episode JSONL file, or an evaluate output dir with one policy.

    A directory holding several policies' episodes is ambiguous: pass the
    file ``<dir>/episodes/<policy>.jsonl`` instead.
    """
    p = Path(path)
    if p.is_file():
        return p.stem, read_jsonl(p)
    if not p.is_dir():
        raise FileNotFoundError(f"Expected an evaluate output directory or an episode JSONL file, got {str(p)!r}")
    files = sorted((p / "episodes").glob("*.jsonl")) if (p / "episodes").is_dir() else sorted(p.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"Expected episode JSONL files in {p}/episodes (from polyturn evaluate), found none")
    if len(files) > 1:
        listed = ", ".join(str(f) for f in files)
        raise ValueError(f"Expected one policy's episodes in {p}, got {len(files)}; pass one of: {listed}")
    return files[0].stem, read_jsonl(files[0])


def make_pairs(
    a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], *, a_name: str, b_name: str, seed: int = 0
) -> list[Pair]:
    """Pair episodes of the same test case (A's order); the left side is drawn with ``random.Random(seed)``."""
    by_key = {R.case_key(r): r for r in b}
    rng = random.Random(seed)
    pairs = []
    for rec in a:
        other = by_key.get(R.case_key(rec))
        if other is None:
            continue
        left: Literal["A", "B"] = "A" if rng.random() < 0.5 else "B"
        pairs.append(Pair(len(pairs), R.case_key(rec), rec, other, a_name, b_name, left))
    if not pairs:
        raise ValueError(f"Expected episodes of the same test cases on both sides ({a_name}, {b_name}), got none in common")
    return pairs


def rating_record(pair: Pair, choice: Choice | None, *, rater: str, seed: int = 0, raw: str | None = None) -> dict[str, Any]:
    """The JSONL record of one choice, with the true identity of each side.

    ``winner`` is ``"A"``, ``"B"``, ``"tie"``, or None when a judge's verdict could not be parsed.
    """
    right = "B" if pair.left == "A" else "A"
    winner = None if choice is None else ("tie" if choice == "tie" else (pair.left if choice == "left" else right))
    names = {"A": pair.a_name, "B": pair.b_name}
    rec = {
        "pair": pair.index, "case_id": pair.key, "task_id": pair.a.get("task_id"),
        "left": pair.left, "right": right, "left_policy": names[pair.left], "right_policy": names[right],
        "a_policy": pair.a_name, "b_policy": pair.b_name, "choice": choice, "winner": winner,
        "rater": rater, "seed": seed, "time": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    if raw is not None:
        rec["raw"] = raw
    return rec


@dataclass(frozen=True)
class WinRate:
    """A's win rate over B with ties as half wins, and its 95% Wilson interval."""

    a_name: str
    b_name: str
    wins_a: int
    wins_b: int
    ties: int
    invalid: int
    rate: float | None
    lo: float | None
    hi: float | None

    @property
    def n(self) -> int:
        """Valid ratings (wins, losses and ties)."""
        return self.wins_a + self.wins_b + self.ties

    def summary(self) -> str:
        """One line, e.g. ``A beats B 0.650 [0.433, 0.819] (wins 6, losses 2, ties 2, n 10)``."""
        if self.rate is None:
            return f"{self.a_name} vs {self.b_name}: no valid ratings"
        return (f"{self.a_name} vs {self.b_name}: win rate {self.rate:.3f} [{self.lo:.3f}, {self.hi:.3f}] "
                f"(wins {self.wins_a}, losses {self.wins_b}, ties {self.ties}, n {self.n}"
                + (f", unparsed {self.invalid})" if self.invalid else ")"))


def win_rate(ratings: Sequence[dict[str, Any]]) -> WinRate:
    """Summarise rating records of one A/B comparison (see the module docstring)."""
    if not ratings:
        return WinRate("A", "B", 0, 0, 0, 0, None, None, None)
    names = {(r.get("a_policy"), r.get("b_policy")) for r in ratings}
    if len(names) > 1:
        raise ValueError(f"Expected ratings of one A/B comparison, got several: {sorted(map(str, names))}")
    a_name, b_name = next(iter(names))
    wa = sum(r.get("winner") == "A" for r in ratings)
    wb = sum(r.get("winner") == "B" for r in ratings)
    ties = sum(r.get("winner") == "tie" for r in ratings)
    invalid = len(ratings) - wa - wb - ties
    n = wa + wb + ties
    if n == 0:
        return WinRate(str(a_name), str(b_name), 0, 0, 0, invalid, None, None, None)
    score = wa + 0.5 * ties
    lo, hi = wilson_interval(score, n)
    return WinRate(str(a_name), str(b_name), wa, wb, ties, invalid, score / n, lo, hi)


# ---- judges --------------------------------------------------------------------------------------
#: ``{task}`` is the environment's ``EnvSpec.task_description`` (who one agent is, what it could do).
JUDGE_TEMPLATE = """You are judging two assistants, each {task}. Both were given the same request. Judge which \
assistant served the user better: a correct final answer matters most, then asking for clarification when the \
request was ambiguous, then efficiency (fewer turns, no errors or repeated calls).

Request:
{question}

[Assistant 1]
{left}

[Assistant 2]
{right}

Explain briefly, then end with exactly one line: "Verdict: 1", "Verdict: 2" or "Verdict: tie"."""

_VERDICT = re.compile(r"verdict\s*[:=]?\s*\**\s*\[?\[?\s*(1|2|tie|one|two)\b", re.IGNORECASE)


def parse_verdict(text: str) -> Choice | None:
    """The judge's choice from its reply (the last ``Verdict: 1|2|tie``); None when there is none.

    >>> parse_verdict("Both ok. Verdict: 2"), parse_verdict("verdict: TIE"), parse_verdict("no idea")
    ('right', 'tie', None)
    """
    found = _VERDICT.findall(text or "")
    if not found:
        bare = (text or "").strip().strip(".").lower()
        found = [bare] if bare in ("1", "2", "tie") else []
    if not found:
        return None
    v = found[-1].lower()
    return "left" if v in ("1", "one") else "right" if v in ("2", "two") else "tie"


def _render(record: dict[str, Any]) -> str:
    return "\n".join(f"{role.upper()}: {text}" for role, text in R.transcript(record, max_chars=500)[1:])


def judge_prompt(pair: Pair, template: str = JUDGE_TEMPLATE) -> str:
    """The judge prompt of a pair: Assistant 1 is the left side, Assistant 2 the right; the task description comes
    from the environment's spec."""
    question = pair.a.get("question") or (pair.a.get("turns") or [{}])[0].get("observation", "")
    spec = R.env_spec_of(pair.a)
    task = spec.task_description if spec is not None else EnvSpec.__dataclass_fields__["task_description"].default
    return template.format(task=task, question=question, left=_render(pair.left_record), right=_render(pair.right_record))


def judge_pairs(
    pairs: Sequence[Pair], judge: Callable[[str], str], *, template: str = JUDGE_TEMPLATE, seed: int = 0,
    rater: str = "llm-judge",
) -> list[dict[str, Any]]:
    """Ask ``judge`` (prompt -> reply text, e.g. a chat-completion call) about every pair.

    Returns one rating record per pair; an unparseable reply gets ``winner``
    None (counted as ``invalid`` by :func:`win_rate`) and keeps the reply in ``raw``.
    """
    out = []
    for pair in pairs:
        reply = judge(judge_prompt(pair, template))
        out.append(rating_record(pair, parse_verdict(reply), rater=rater, seed=seed, raw=reply))
    return out


def chat_completion_judge(
    model: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
    max_retries: int = 2,
) -> Callable[[str], str]:
    """A judge (prompt -> reply) backed by an OpenAI-compatible ``/chat/completions`` endpoint: the one HTTP call of
    the LLM judges, :func:`polyturn.acting.judge.chat_completion` (timeouts, the ``openai`` client's retries with
    backoff, errors as messages naming the URL; greedy decoding)."""
    return chat_completion(model, base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)


def _errors(record: dict[str, Any]) -> int:
    return sum(R.turn_error(t) is not None for t in record.get("turns", []))


def heuristic_verdict(left: dict[str, Any], right: dict[str, Any]) -> Choice:
    """Offline judge: success beats failure, then fewer turns, then fewer error turns; else a tie."""
    for key in (lambda r: not R.is_success(r), lambda r: len(r.get("turns", [])), _errors):
        kl, kr = key(left), key(right)
        if kl != kr:
            return "left" if kl < kr else "right"
    return "tie"


def heuristic_judge_pairs(pairs: Sequence[Pair], *, seed: int = 0) -> list[dict[str, Any]]:
    """Rate every pair with :func:`heuristic_verdict` (no model, no network)."""
    return [rating_record(p, heuristic_verdict(p.left_record, p.right_record), rater="heuristic", seed=seed)
            for p in pairs]
