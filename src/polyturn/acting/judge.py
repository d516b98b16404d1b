"""An LLM judge of whole episodes: a score for sessions whose outcome nobody knows (issue 57, "learn from records").

A chat model behind any OpenAI-compatible ``/chat/completions`` endpoint reads one episode (the task, then the
agent's actions and what it was answered, but not the env's answer to the last action: that is the env's verdict)
with the environment's rubric (``EnvSpec.task_description``) and scores it, in one of two ways (``scoring``):

* ``score``: its reply ends with ``Score: N``, N an integer from 1 to 10. :func:`parse_score` reads that line
  strictly: a reply without it is a :class:`MalformedReply`, never a guess; ``s = (N - 1) / 9``;
* ``yes_no``: it is asked whether the assistant did the task, answered in one word, and ``s`` is the probability of
  "Yes" against "No" among its first token's top log-probs (:func:`parse_yes_no`; the token-probability judges of
  G-Eval and P(True)), which small models give where they write no ``Score:`` line.

``s`` in [0, 1] is a reward term for offline RL (records with no known outcome, ``offline.judge``) and, optionally,
online training (config ``judge``, the term ``judge/score``); docs/judge.md.

* :func:`chat_completion` is the HTTP call, through the ``openai`` client: a timeout per call and the client's retries
  (timeouts, dropped connections, HTTP 408/409/429/5xx, with exponential backoff and ``Retry-After``).
* :class:`JudgeCache` keeps every verdict in a JSONL file, keyed by the episode (:func:`episode_key`, a hash of the
  conversation), the judge model and the prompt: an episode judged once is not sent again.
* :func:`judge_records` judges many episodes, at most ``concurrency`` calls at a time; each verdict is cached as it
  arrives, so a failure (a malformed reply, a server that stops answering) loses nothing judged before it, and its
  error names the episode (or, ``on_malformed="record"``, a malformed reply is that episode's recorded error).
* :func:`agreement` measures the judge against the outcome where the outcome is known (:func:`outcome_known`): the
  accuracy of score >= 0.5 as success, the AUC of the score for success against failure and Spearman's rank
  correlation, the hacking guard of a judge reward.

Lives in the acting layer because evaluation, training (the online reward term) and the CLI all use it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from polyturn.acting.jsonl import append_jsonl, read_jsonl
from polyturn.acting.registry import spec_or_none
from polyturn.envs.spec import EnvSpec

#: The record fields ``polyturn judge`` writes (and replaces when a judged file is judged again).
JUDGE_FIELDS = ("judge", "judge_score", "judge_model", "judge_error", "judge_reply")
#: The score scale the prompt asks for.
LOW, HIGH = 1, 10

#: ``{task}`` is the environment's ``EnvSpec.task_description``.
EPISODE_TEMPLATE = """You are judging one assistant: {task}. Judge how well it served the user: a correct final \
answer matters most, then asking for clarification when the request was ambiguous, then efficiency (fewer turns, no \
errors or repeated calls).

Request:
{question}

[Conversation]
{transcript}

Explain briefly, then end with exactly one line "Score: N", where N is an integer from 1 (useless) to 10 (perfect)."""

#: How every ``yes_no`` prompt ends: one word, whose first token's probabilities are the score.
YES_NO_ANSWER = "Answer with one word: Yes or No."
#: ``scoring="yes_no"``'s prompt.
YES_NO_TEMPLATE = """You are judging one assistant: {task}.

Request:
{question}

[Conversation]
{transcript}

Did the assistant accomplish the user's request correctly? """ + YES_NO_ANSWER

#: How a judge's reply becomes a score (``polyturn judge --scoring``, ``judge.scoring``).
SCORINGS = ("score", "yes_no")
#: ``yes_no``: how many of the first token's most likely tokens the endpoint is asked for (OpenAI allows 20).
TOP_LOGPROBS = 20

_SCORE_LINE = re.compile(r"score\s*:\s*(\d{1,2})(?:\s*/\s*10)?\.?", re.IGNORECASE)


class MalformedReply(ValueError):
    """A judge reply whose last line is not ``Score: N`` with N in 1..10."""


def parse_score(text: str) -> int:
    """The score on the reply's last non-empty line, which must be ``Score: N`` (optionally ``/10``), N in 1..10.

    >>> parse_score("Correct and short.\\nScore: 9"), parse_score("score: 3/10")
    (9, 3)
    """
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    m = _SCORE_LINE.fullmatch(lines[-1]) if lines else None
    if m is None or not LOW <= int(m.group(1)) <= HIGH:
        last = repr(lines[-1][:80]) if lines else "an empty reply"
        raise MalformedReply(f"Expected the judge's reply to end with a line 'Score: N' (N from {LOW} to {HIGH}), "
                             f"got {last}")
    return int(m.group(1))


def normalized(score: int) -> float:
    """A 1-10 score mapped to [0, 1]: ``(score - 1) / 9``."""
    return (score - LOW) / (HIGH - LOW)


def parse_yes_no(reply: str) -> float:
    """``P(yes) / (P(yes) + P(no))`` from a ``yes_no`` reply: the JSON ``{token: logprob}`` of the first token's top
    log-probs that :func:`chat_completion` returns. A token counts as yes / no when, stripped and lower-cased, it is
    ``yes`` / ``no`` ("Yes", " yes", "YES"); neither among them is a :class:`MalformedReply`.

    >>> round(parse_yes_no('{"Yes": -0.5, " yes": -2.0, "No": -1.5, "The": -3.0}'), 4)
    0.7858
    """
    try:
        top = {str(k): float(v) for k, v in json.loads(reply).items()}
    except (ValueError, AttributeError, TypeError):
        raise MalformedReply(f"Expected the first token's top log-probs as JSON, got {reply[:80]!r}") from None
    mass = {"yes": 0.0, "no": 0.0}
    for tok, lp in top.items():
        word = tok.strip().lower()
        if word in mass:
            mass[word] += math.exp(lp)
    if mass["yes"] + mass["no"] <= 0.0:
        best = sorted(top, key=top.__getitem__, reverse=True)[:5]
        raise MalformedReply(f"Expected 'Yes' or 'No' among the judge's {len(top)} most likely first tokens, got "
                             f"{best}")
    return mass["yes"] / (mass["yes"] + mass["no"])


def score_of(value: float) -> int:
    """The 1-10 figure of a [0, 1] value (``judge_score`` of a ``yes_no`` verdict): ``1 + 9 value``, halves up."""
    return LOW + math.floor((HIGH - LOW) * value + 0.5)


def episode_key(record: dict[str, Any]) -> str:
    """A hash of what the episode said: its env, task, seed, question, each turn's observation and action, and its
    final observation. Timings, rewards, policy names and judge fields are left out, so the same conversation gets
    the same key in a served record, an evaluation record, a judged copy or an episode collected in training.

    >>> a = {"env_id": "e", "turns": [{"observation": "q", "action": "a", "latency_s": 0.1}]}
    >>> episode_key(a) == episode_key({**a, "turns": [{**a["turns"][0], "latency_s": 9}], "judge": 1.0})
    True
    """
    turns = [[str(t.get("observation", "")), str(t.get("action", ""))] for t in record.get("turns") or []]
    body = [record.get("env_id"), record.get("task_id"), record.get("seed"), record.get("question"), turns,
            record.get("final_observation", "")]
    return hashlib.sha256(json.dumps(body, ensure_ascii=False, default=str).encode()).hexdigest()


def transcript(record: dict[str, Any], *, max_chars: int = 500, final: bool = False) -> str:
    """The conversation as lines ``AGENT: ...`` / ``ENV: ...`` (``USER: ...`` for a chat session's messages).

    The env's answer to the last action (``final_observation``) is left out unless ``final``: in an ended episode it
    is the env's verdict ("Answer submitted: incorrect."), which a session with no known outcome never has, and a
    judge that read it would agree with the outcome for nothing."""

    def cut(s: Any) -> str:
        s = str(s)
        return s if len(s) <= max_chars else s[: max_chars - 1] + "…"

    turns = record.get("turns") or []
    reply = "USER" if record.get("env_id") == "chat" else "ENV"
    last = record.get("final_observation", "") if final else ""
    lines = []
    for t, turn in enumerate(turns):
        lines.append(f"AGENT: {cut(turn.get('action', ''))}")
        after = turns[t + 1].get("observation", "") if t + 1 < len(turns) else last
        if after:
            lines.append(f"{reply}: {cut(after)}")
    return "\n".join(lines)


def judge_prompt(record: dict[str, Any], template: str = EPISODE_TEMPLATE, *, final: bool = False) -> str:
    """The prompt for one episode, with its environment's rubric (a chat session's is the spec default);
    ``final``: show the env's answer to the last action too (:func:`transcript`)."""
    spec = spec_or_none(record.get("env_id"))
    task = spec.task_description if spec is not None else EnvSpec.__dataclass_fields__["task_description"].default
    turns = record.get("turns") or [{}]
    question = record.get("question") or turns[0].get("observation", "")
    return template.format(task=task, question=question, transcript=transcript(record, final=final))


def outcome_known(record: dict[str, Any]) -> bool:
    """Whether the record's ``success`` is a known outcome: an environment episode that ended (terminated or cut by
    its turn limit), or a session with a feedback outcome. A session closed mid-episode has none."""
    if any(f.get("outcome") for f in record.get("feedback") or []):
        return True
    turns = record.get("turns") or []
    return record.get("env_id") != "chat" and bool(turns) and bool(turns[-1].get("terminated")
                                                                      or turns[-1].get("truncated"))


# ---- the HTTP call -------------------------------------------------------------------------------
def chat_completion(
    model: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
    max_retries: int = 2, http_client: Any = None, scoring: str = "score", max_tokens: int = 512,
) -> Callable[[str], str]:
    """A function prompt -> reply text backed by an OpenAI-compatible ``/chat/completions`` endpoint.

    A ``score`` reply is at most ``max_tokens`` tokens (a reply cut there without its ``Score:`` line is malformed).
    ``scoring="yes_no"`` asks for one token with its ``TOP_LOGPROBS`` most likely alternatives (``logprobs: true``)
    and returns them as the JSON ``{token: logprob}`` that :func:`parse_yes_no` reads; an endpoint that answers
    without log-probs is an error saying so (``polyturn serve`` returns them from its batched home engine).

    Calls go through the ``openai`` client: each waits at most ``timeout`` seconds, and a timeout, a dropped
    connection, HTTP 408/409/429 or a 5xx is retried up to ``max_retries`` times with the client's exponential
    backoff (honouring the server's ``Retry-After``). ``base_url`` defaults to ``$OPENAI_BASE_URL`` or
    ``https://api.openai.com/v1`` and ``api_key`` to ``$OPENAI_API_KEY`` (a local server may need none: no key sends
    no ``Authorization`` header). Greedy decoding (temperature 0) so reruns agree. A call that still fails raises
    ValueError naming the URL and the server's answer, so a wrong URL, model or key reads as a message, not a
    traceback. The function may be called from several threads at once.
    """
    import openai  # the client costs ~1 s to import; only the judge commands need it

    if timeout <= 0 or max_retries < 0:
        raise ValueError(f"Expected timeout > 0 and max_retries >= 0, got timeout={timeout}, max_retries={max_retries}")
    if scoring not in SCORINGS:
        raise ValueError(f"Expected scoring in {SCORINGS}, got {scoring!r}")
    if max_tokens < 1:
        raise ValueError(f"Expected max_tokens >= 1, got {max_tokens}")
    base = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    url = f"{base}/chat/completions"
    client = openai.OpenAI(base_url=base, api_key=key or "unused", timeout=timeout, max_retries=max_retries,
                           http_client=http_client)
    headers = None if key else {"Authorization": openai.Omit()}

    probs = scoring == "yes_no"
    extra = {"max_tokens": 1, "logprobs": True, "top_logprobs": TOP_LOGPROBS} if probs else {"max_tokens": max_tokens}

    def ask(prompt: str) -> str:
        try:
            resp = client.chat.completions.create(model=model, temperature=0, extra_headers=headers,
                                                  messages=[{"role": "user", "content": prompt}], **extra)
        except openai.APIStatusError as e:
            detail = e.response.text[:300]
            raise ValueError(f"LLM judge at {url} answered HTTP {e.status_code}: {detail}") from None
        except openai.APIConnectionError as e:  # also a timeout (APITimeoutError), after the retries
            reason = e.__cause__ or e
            raise ValueError(f"Expected an OpenAI-compatible server at {url}, could not reach it "
                             f"within {timeout:g} s and {max_retries} retries ({reason})") from None
        except (openai.APIResponseValidationError, json.JSONDecodeError):
            raise ValueError(f"LLM judge at {url} did not answer JSON") from None
        if isinstance(resp, str) or not resp.choices or resp.choices[0].message is None:  # str: not JSON at all
            raise ValueError(f"LLM judge at {url} answered without choices[0].message.content: {str(resp)[:300]}")
        if not probs:
            return str(resp.choices[0].message.content or "")
        lp = resp.choices[0].logprobs
        if lp is None or not lp.content or not lp.content[0].top_logprobs:
            raise ValueError(f"LLM judge at {url} answered without top log-probs (choices[0].logprobs.content[0]."
                             "top_logprobs): --scoring yes_no needs an endpoint that returns them (vLLM, OpenAI, "
                             "polyturn serve's home engine); use --scoring score with this one")
        return json.dumps({t.token: t.logprob for t in lp.content[0].top_logprobs})

    return ask


def check_endpoint(*, base_url: str | None = None, api_key: str | None = None, timeout: float = 10.0,
                   field: str = "judge.endpoint") -> None:
    """Fail fast, before a training run spends hours before its first judge call: ``ValueError`` naming ``field``
    when the endpoint cannot be reached or refuses the key (``GET /models``). A server without that route (HTTP 404)
    passes: only the first call can tell then."""
    import openai

    base = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    client = openai.OpenAI(base_url=base, api_key=key or "unused", timeout=timeout, max_retries=1)
    try:
        client.models.list(extra_headers=None if key else {"Authorization": openai.Omit()})
    except openai.APIStatusError as e:
        if e.status_code in (401, 403):
            raise ValueError(f"{field}: the LLM judge at {base} refused the key (HTTP {e.status_code}); set "
                             "$OPENAI_API_KEY") from None
    except openai.APIConnectionError as e:
        raise ValueError(f"{field}: Expected an OpenAI-compatible server at {base}, could not reach it "
                         f"({e.__cause__ or e})") from None


# ---- the cache -----------------------------------------------------------------------------------
class JudgeCache:
    """Verdicts by (episode key, judge model, prompt hash), kept in a JSONL file (one appended line per verdict).

    ``path`` None keeps them in memory only. Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], dict[str, Any]] = {}
        if self.path is not None and self.path.is_file():
            for e in read_jsonl(self.path, partial_tail=True):  # a run killed mid-write leaves a partial last line
                self._entries[(e["key"], e["model"], e["prompt_sha"])] = e

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, model: str, prompt_sha: str) -> dict[str, Any] | None:
        """The cached verdict, or None."""
        with self._lock:
            return self._entries.get((key, model, prompt_sha))

    def put(self, entry: dict[str, Any]) -> None:
        """Keep a verdict (``key``, ``model``, ``prompt_sha``, ``score``, ``reply``), on disk at once."""
        with self._lock:
            self._entries[(entry["key"], entry["model"], entry["prompt_sha"])] = entry
            if self.path is not None:
                append_jsonl(self.path, entry)


# ---- judging many episodes -----------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """One episode's judgement: the 1-10 score and its [0, 1] form, the reply, whether it came from the cache; or,
    for a malformed reply under ``on_malformed="record"``, no score and the ``error``."""

    score: int | None
    value: float | None
    reply: str
    cached: bool
    error: str | None = None


class JudgeError(ValueError):
    """A judge call failed or its reply was malformed; the message names the episode."""


def prompt_key(prompt: str) -> str:
    """A short hash of the prompt (the rubric and template are part of what a cached verdict answered)."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def judge_records(
    records: Sequence[dict[str, Any]], ask: Callable[[str], str], *, model: str, cache: JudgeCache,
    names: Sequence[str] | None = None, concurrency: int = 4, progress: Callable[[int], None] | None = None,
    on_malformed: Literal["stop", "record"] = "stop", template: str | None = None, scoring: str = "score",
    final: bool = False,
) -> list[Verdict]:
    """Judge every record (``ask``: prompt -> reply, a :func:`chat_completion` of the same ``scoring``) with at most
    ``concurrency`` calls in flight; cached episodes are not sent. Returns one :class:`Verdict` per record, in order.
    ``template`` defaults to the scoring's (``EPISODE_TEMPLATE``, ``YES_NO_TEMPLATE``); ``final`` shows the env's
    answer to the last action (a segment's, where it is a tool's result, not the env's verdict).

    A call that failed after its retries stops the sending: calls already in flight finish and are cached, and
    :class:`JudgeError` names the episode (``names[i]``, default ``record i``). A malformed reply does the same under
    ``on_malformed="stop"``; under ``"record"`` its verdict carries the error and no score (not cached: a rerun asks
    again), and the others go on.
    """
    if concurrency < 1:
        raise ValueError(f"Expected concurrency >= 1, got {concurrency}")
    if scoring not in SCORINGS:
        raise ValueError(f"Expected scoring in {SCORINGS}, got {scoring!r}")
    template = template or (YES_NO_TEMPLATE if scoring == "yes_no" else EPISODE_TEMPLATE)
    names = list(names) if names is not None else [f"record {i + 1}" for i in range(len(records))]
    out: list[Verdict | None] = [None] * len(records)
    todo: list[tuple[int, str, str, str]] = []
    for i, rec in enumerate(records):
        prompt = judge_prompt(rec, template, final=final)
        key, sha = episode_key(rec), prompt_key(prompt)
        hit = cache.get(key, model, sha)
        if hit is not None:
            value = float(hit["value"]) if "value" in hit else normalized(int(hit["score"]))
            out[i] = Verdict(int(hit["score"]), value, str(hit.get("reply", "")), True)
        else:
            todo.append((i, prompt, key, sha))
    if progress is not None and len(todo) < len(records):
        progress(len(records) - len(todo))
    stop, lock = threading.Event(), threading.Lock()

    def one(i: int, prompt: str, key: str, sha: str) -> None:
        if stop.is_set():
            return
        try:
            reply = ask(prompt)
        except ValueError as e:  # the client's messages: unreachable, timed out, HTTP errors
            stop.set()
            raise JudgeError(f"judging {names[i]}: {e}") from None
        try:
            if scoring == "yes_no":
                value = parse_yes_no(reply)
                score = score_of(value)
            else:
                score = parse_score(reply)
                value = normalized(score)
        except MalformedReply as e:
            if on_malformed == "stop":
                stop.set()
                raise JudgeError(f"judging {names[i]}: {e}") from None
            out[i] = Verdict(None, None, reply, False, error=str(e))
        else:
            cache.put({"key": key, "model": model, "prompt_sha": sha, "score": score, "value": value, "reply": reply})
            out[i] = Verdict(score, value, reply, False)
        if progress is not None:
            with lock:
                progress(1)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures: list[Future] = [pool.submit(one, *job) for job in todo]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            for f in futures:
                f.cancel()
            wait(futures)
            raise failed[0].exception()
    return [v for v in out if v is not None]


def agreement(scores: Sequence[float], success: Sequence[bool], *, threshold: float = 0.5
              ) -> dict[str, float | int | None]:
    """How the judge's [0, 1] scores agree with known outcomes: ``accuracy`` (score >= ``threshold`` read as a
    success), ``auc`` (the chance a success scores above a failure, ties half: Mann-Whitney U / (n_success x
    n_failure)), ``spearman`` (rank correlation with success) and the counts. ``auc`` and ``spearman`` are None when
    the outcomes are all one kind (nothing to rank) and, ``spearman``, when the scores are all one value;
    ``accuracy`` is None without episodes."""
    from scipy import stats  # scipy costs ~0.5 s to import; only agreement needs it

    pos = [s for s, ok in zip(scores, success) if ok]
    neg = [s for s, ok in zip(scores, success) if not ok]
    n = len(pos) + len(neg)
    hits = sum(s >= threshold for s in pos) + sum(s < threshold for s in neg)
    out: dict[str, float | int | None] = {"n": n, "successes": len(pos), "accuracy": hits / n if n else None,
                                          "auc": None, "spearman": None}
    if pos and neg:
        u = stats.mannwhitneyu(pos, neg, alternative="two-sided").statistic
        out["auc"] = float(u) / (len(pos) * len(neg))
        if len(set(scores)) > 1:
            out["spearman"] = float(stats.spearmanr(scores, [float(x) for x in success]).statistic)
    return out
