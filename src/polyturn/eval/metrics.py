"""Evaluation metrics over episode records: task, dialogue and system dimensions (seed 001, 5.1).

Each metric is a :class:`MetricSpec` in :data:`METRICS` with a one-line
definition that the report prints next to it (:func:`metrics_for` fills in
examples from the environments' specs: which action types perform a key
action, which errors are timeouts), and the test used to compare
two policies on it (``z``: two-proportion z-test; ``welch``: Welch's t-test
on per-episode samples; ``bootstrap``: unpaired bootstrap over episodes;
``jackknife``: delete-one-episode jackknife, for distinct-n; see
:mod:`polyturn.eval.stats`).

:func:`episode_stats` reduces each record once to the counts every metric
needs; :func:`compute_metrics` turns a policy's stats into values with 95%
intervals, and :func:`compare` tests the difference between two policies.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from polyturn.eval import records as R
from polyturn.envs.spec import EnvSpec
from polyturn.eval.embed import Embedder, TfidfEmbedder
from polyturn.eval.stats import (
    Z95,
    bootstrap_interval,
    bootstrap_p,
    jackknife_se,
    percentile,
    t_interval,
    two_proportion_z,
    welch_t,
    wilson_interval,
    z_from_se,
)

Group = Literal["task", "dialogue", "system", "env", "cost"]
Test = Literal["z", "welch", "bootstrap", "jackknife"]

_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens (the unit of distinct-n).

    >>> words("Action: run_sql[{}]")
    ['action', ':', 'run_sql', '[', '{', '}', ']']
    """
    return _WORD.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The ``n``-grams of one token sequence (none when it is shorter than ``n``)."""
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(actions: Sequence[str], n: int) -> float | None:
    """Unique ``n``-grams / total ``n``-grams over ``actions`` (n-grams never cross two actions).

    >>> distinct_n(["a b a b"], 1), distinct_n(["a b", "a b"], 2)
    (0.5, 0.5)
    """
    grams = [g for a in actions for g in ngrams(words(a), n)]
    return len(set(grams)) / len(grams) if grams else None


@dataclass
class EpisodeStats:
    """Everything the metrics read from one episode record."""

    success: bool
    crashed: bool
    tool_timeout: bool
    n_turns: int
    ret: float
    level: int
    key_matched: int
    key_expected: int
    error_turns: int
    invalid_turns: int
    repeated_actions: int
    latencies: list[float]
    gen_tokens: int
    gen_seconds: float
    gram_sets: dict[int, set] = field(default_factory=dict)
    gram_totals: dict[int, int] = field(default_factory=dict)
    coherence: list[float] = field(default_factory=list)
    #: the env's own per-episode metrics (:attr:`polyturn.envs.spec.EnvSpec.metrics`), name -> value
    env_values: dict[str, float] = field(default_factory=dict)
    #: each cost term summed over the turns (records that carry ``cost_terms``; empty otherwise)
    costs: dict[str, float] = field(default_factory=dict)


def repeated_actions(actions: Sequence[str]) -> int:
    """How many actions repeat (after stripping whitespace) an earlier action of the same episode.

    >>> repeated_actions(["a", "b", " a", "a"])
    2
    """
    seen: set[str] = set()
    n = 0
    for a in actions:
        key = a.strip()
        n += key in seen
        seen.add(key)
    return n


def coherence_scores(records: Sequence[dict[str, Any]], encoder: Embedder) -> list[list[float]]:
    """Per episode, per turn: cosine(embedding of the action, embedding of the conversation before it).

    The conversation before turn t is the task, every earlier action and
    observation, and the observation turn t answers; long contexts keep their
    end. ``encoder`` must embed both calls in one space (MiniLM does; TF-IDF
    fitted per call does not).
    """
    if isinstance(encoder, TfidfEmbedder):
        raise ValueError("Expected an embedder with one fixed vector space (MiniLM) for coherence, got TF-IDF, "
                         "which fits a new vocabulary per call")
    contexts, actions, owner = [], [], []
    for i, rec in enumerate(records):
        turns = rec.get("turns", [])
        parts: list[str] = []
        for t, turn in enumerate(turns):
            parts.append(str(turn.get("observation", "")))
            contexts.append("\n".join(parts))
            actions.append(str(turn.get("action", "")))
            owner.append(i)
            parts.append(str(turn.get("action", "")))
    out: list[list[float]] = [[] for _ in records]
    if not actions:
        return out
    ctx = encoder.encode(contexts, keep="end")
    act = encoder.encode(actions, keep="start")
    sims = (ctx * act).sum(1)
    for i, s in zip(owner, sims):
        out[i].append(float(s))
    return out


def episode_stats(record: dict[str, Any], *, coherence: list[float] | None = None) -> EpisodeStats:
    """Reduce one episode record to :class:`EpisodeStats`."""
    turns = record.get("turns", [])
    actions = [str(t.get("action", "")) for t in turns]
    matched, expected = R.key_action_hits(record)
    gen_tokens, gen_seconds = 0, 0.0
    for t in turns:
        # Decode time share when recorded (batched actors), else the whole turn latency.
        seconds = t.get("gen_s") if t.get("gen_s") is not None else t.get("latency_s")
        if t.get("n_tokens") is not None and seconds is not None:
            gen_tokens += int(t["n_tokens"])
            gen_seconds += float(seconds)
    tokens = [words(a) for a in actions]
    spec = R.env_spec_of(record)
    timeouts = set(spec.timeout_errors) if spec is not None else set()
    env_values = {}
    for m in spec.metrics if spec is not None and not record.get("crashed") else ():
        v = m.value(record)
        if v is not None:
            env_values[m.name] = float(v)
    return EpisodeStats(
        success=R.is_success(record),
        crashed=bool(record.get("crashed")),
        tool_timeout=any(R.turn_error(t) in timeouts for t in turns),
        n_turns=len(turns),
        ret=float(record.get("return", sum(float(t.get("reward", 0.0)) for t in turns))),
        level=int(record.get("level", 0) or 0),
        key_matched=matched,
        key_expected=expected,
        error_turns=sum(R.turn_error(t) is not None for t in turns),
        invalid_turns=sum(not R.is_valid(t) for t in turns),
        repeated_actions=repeated_actions(actions),
        latencies=[float(t["latency_s"]) for t in turns if t.get("latency_s") is not None],
        gen_tokens=gen_tokens,
        gen_seconds=gen_seconds,
        gram_sets={n: {g for tok in tokens for g in ngrams(tok, n)} for n in (1, 2)},
        gram_totals={n: sum(len(ngrams(tok, n)) for tok in tokens) for n in (1, 2)},
        coherence=list(coherence or []),
        env_values=env_values,
        costs=record_costs(record),
    )


def record_costs(record: dict[str, Any]) -> dict[str, float]:
    """Each cost term (``turns[t].cost_terms``) summed over the record's turns; empty when none carries any."""
    out: dict[str, float] = {}
    for t in record.get("turns", []):
        for k, v in (t.get("cost_terms") or {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


Stat = Callable[[Sequence[EpisodeStats]], "float | None"]


def _ratio(num: Callable[[EpisodeStats], float], den: Callable[[EpisodeStats], float]) -> Stat:
    def stat(eps: Sequence[EpisodeStats]) -> float | None:
        d = sum(den(e) for e in eps)
        return sum(num(e) for e in eps) / d if d else None

    stat.num, stat.den = num, den  # type: ignore[attr-defined]  # lets the bootstrap vectorise ratios
    return stat


def _distinct(n: int) -> Stat:
    def stat(eps: Sequence[EpisodeStats]) -> float | None:
        total = sum(e.gram_totals.get(n, 0) for e in eps)
        return len(set().union(*(e.gram_sets.get(n, set()) for e in eps))) / total if total else None

    def loo(eps: Sequence[EpisodeStats]) -> np.ndarray:
        """Distinct-n with each episode left out: drop the n-grams only that episode used."""
        owners = Counter(g for e in eps for g in e.gram_sets.get(n, set()))
        unique, total = len(owners), sum(e.gram_totals.get(n, 0) for e in eps)
        out = []
        for e in eps:
            only = sum(owners[g] == 1 for g in e.gram_sets.get(n, set()))
            rest = total - e.gram_totals.get(n, 0)
            out.append((unique - only) / rest if rest else np.nan)
        return np.array(out, float)

    stat.loo = loo  # type: ignore[attr-defined]
    return stat


def _latency(q: float) -> Stat:
    return lambda eps: percentile([x for e in eps for x in e.latencies], q)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name, the definition shown in the report, how it is computed and compared.

    ``samples`` (Welch metrics) gives the per-episode samples whose mean is
    the metric; ``counts`` (z metrics) gives ``(successes, trials)``.
    """

    name: str
    label: str
    group: Group
    definition: str
    test: Test
    stat: Stat
    fmt: Literal["rate", "float", "seconds", "rate_per_s"] = "float"
    higher_is_better: bool | None = None
    counts: Callable[[Sequence[EpisodeStats]], tuple[int, int]] | None = None
    samples: Callable[[Sequence[EpisodeStats]], list[float]] | None = None


def _prop(pred: Callable[[EpisodeStats], bool]) -> tuple[Stat, Callable[[Sequence[EpisodeStats]], tuple[int, int]]]:
    def counts(eps: Sequence[EpisodeStats]) -> tuple[int, int]:
        return sum(bool(pred(e)) for e in eps), len(eps)

    def stat(eps: Sequence[EpisodeStats]) -> float | None:
        k, n = counts(eps)
        return k / n if n else None

    return stat, counts


def _mean_of(samples: Callable[[Sequence[EpisodeStats]], list[float]]) -> Stat:
    def stat(eps: Sequence[EpisodeStats]) -> float | None:
        s = samples(eps)
        return float(np.mean(s)) if s else None

    return stat


_succ = _prop(lambda e: e.success)
_crash = _prop(lambda e: e.crashed)
_timeout = _prop(lambda e: e.tool_timeout)
_turns_samples: Callable[[Sequence[EpisodeStats]], list[float]] = lambda eps: [float(e.n_turns) for e in eps if e.success]  # noqa: E731
_return_samples: Callable[[Sequence[EpisodeStats]], list[float]] = lambda eps: [e.ret for e in eps]  # noqa: E731

#: Every metric, in report order.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("success_rate", "Success rate", "task",
               "Episodes the environment judged a success / episodes; 95% Wilson interval.",
               "z", _succ[0], "rate", True, counts=_succ[1]),
    MetricSpec("turns_to_success", "Turns to completion", "task",
               "Mean number of agent turns in the successful episodes.",
               "welch", _mean_of(_turns_samples), "float", False, samples=_turns_samples),
    MetricSpec("key_action_accuracy", "Key-action accuracy", "task",
               "Expected key actions performed by a valid action (multiset match; the env's spec says which "
               "action types perform each key action) / expected key actions, pooled over episodes.",
               "bootstrap", _ratio(lambda e: e.key_matched, lambda e: e.key_expected), "rate", True),
    MetricSpec("error_response_rate", "Error-response rate", "task",
               "Turns whose info reports an error (tool error, repeat) or an invalid action / turns.",
               "bootstrap", _ratio(lambda e: e.error_turns, lambda e: e.n_turns), "rate", False),
    MetricSpec("return_mean", "Mean return", "task",
               "Mean episode return (sum of every reward term).",
               "welch", _mean_of(_return_samples), "float", True, samples=_return_samples),
    MetricSpec("distinct_1", "Distinct-1", "dialogue",
               "Unique word unigrams / total unigrams over all agent actions (lower-cased word and punctuation "
               "tokens; n-grams never cross two actions).",
               "jackknife", _distinct(1), "float", None),
    MetricSpec("distinct_2", "Distinct-2", "dialogue",
               "Unique word bigrams / total bigrams over all agent actions (as distinct-1).",
               "jackknife", _distinct(2), "float", None),
    MetricSpec("coherence", "Coherence", "dialogue",
               "Mean cosine similarity between the MiniLM embedding (mean-pooled, L2-normalised) of each agent "
               "action and that of the conversation before it: a sentence-level, BERTScore-like proxy.",
               "bootstrap", lambda eps: _flat_mean([x for e in eps for x in e.coherence]), "float", True),
    MetricSpec("repetition_rate", "Repetition rate", "dialogue",
               "Agent actions identical (whitespace stripped) to an earlier action of the same episode / actions.",
               "bootstrap", _ratio(lambda e: e.repeated_actions, lambda e: e.n_turns), "rate", False),
    MetricSpec("latency_p50", "Latency p50", "system",
               "Median per-turn latency: producing the action plus the env step (batched actors: the batch's "
               "decode step).", "bootstrap", _latency(50), "seconds", False),
    MetricSpec("latency_p95", "Latency p95", "system", "95th percentile of per-turn latency.",
               "bootstrap", _latency(95), "seconds", False),
    MetricSpec("latency_p99", "Latency p99", "system", "99th percentile of per-turn latency (seed target: < 0.8 s).",
               "bootstrap", _latency(99), "seconds", False),
    MetricSpec("tokens_per_s", "Tokens/s", "system",
               "Generated action tokens / decode seconds (actor policies only). A batched decode step's time "
               "is shared among its rows in proportion to their tokens, so this is the batch's throughput.",
               "bootstrap", _ratio(lambda e: e.gen_tokens, lambda e: e.gen_seconds), "rate_per_s", True),
    MetricSpec("invalid_action_rate", "Invalid-action rate", "system",
               "Turns the env rejected as invalid (unparseable, unknown tool, bad arguments) / turns.",
               "bootstrap", _ratio(lambda e: e.invalid_turns, lambda e: e.n_turns), "rate", False),
    MetricSpec("crash_rate", "Crashed episodes", "system",
               "Episodes that raised an exception while running (caught and recorded) / episodes.",
               "z", _crash[0], "rate", False, counts=_crash[1]),
    MetricSpec("tool_timeout_rate", "Tool-timeout episodes", "system",
               "Episodes with at least one tool timeout (an error kind the env's spec names in timeout_errors) "
               "/ episodes.",
               "z", _timeout[0], "rate", False, counts=_timeout[1]),
)

METRIC_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def env_metric_specs(env_ids: Sequence[str | None]) -> tuple[MetricSpec, ...]:
    """The environments' own metrics (:attr:`polyturn.envs.spec.EnvSpec.metrics`) as ``welch`` metrics over the
    episodes that have a value, in the order the env ids first appear."""
    out: dict[str, MetricSpec] = {}
    for env_id in dict.fromkeys(env_ids):
        spec = R.env_spec_of({"env_id": env_id})
        for m in spec.metrics if spec is not None else ():
            def samples(eps: Sequence[EpisodeStats], name: str = m.name) -> list[float]:
                return [e.env_values[name] for e in eps if name in e.env_values]

            out.setdefault(m.name, MetricSpec(m.name, m.title, "env", m.description, "welch", _mean_of(samples),
                                              "rate" if m.unit == "rate" else "float", m.higher_is_better,
                                              samples=samples))
    return tuple(out.values())


def cost_metric_specs(records: Sequence[dict[str, Any]]) -> tuple[MetricSpec, ...]:
    """A ``welch`` metric per cost term the records carry (``cost/violation`` ...): its mean per episode over the
    episodes that report it (lower is better), in the order the terms first appear."""
    terms = dict.fromkeys(k for r in records for t in r.get("turns", []) for k in (t.get("cost_terms") or {}))
    out = []
    for term in terms:
        def samples(eps: Sequence[EpisodeStats], term: str = term) -> list[float]:
            return [e.costs[term] for e in eps if term in e.costs]

        out.append(MetricSpec(term, f"Cost {term.removeprefix('cost/')}", "cost",
                              f"Mean per episode of the env's cost term {term} (info['cost_terms'], reported beside "
                              "the reward and not in it), summed over the episode's turns.",
                              "welch", _mean_of(samples), "float", False, samples=samples))
    return tuple(out)


def _key_action_example(spec: EnvSpec) -> str | None:
    """The first key action the spec maps to other action types than its own name (``a = b or c``)."""
    for name, types in spec.key_actions.items():
        if tuple(types) != (name,):
            return f"{name} = {' or '.join(types)}"
    return None


def described_for(specs: Sequence[EnvSpec]) -> tuple[MetricSpec, ...]:
    """:data:`METRICS` with the definitions that depend on the environment told from ``specs`` (none: generic)."""
    def named(spec: EnvSpec, text: str) -> str:
        return f"{spec.id}: {text}" if len(specs) > 1 else text

    keys = [named(s, ex) for s in specs if (ex := _key_action_example(s)) is not None]
    if keys:
        key_how = "; ".join(keys)
    elif specs:
        key_how = "each key action is performed by the action type of the same name"
    else:
        key_how = "the env's spec says which action types perform each key action"
    timeouts = [named(s, " or ".join(s.timeout_errors)) for s in specs if s.timeout_errors]
    if timeouts:
        timeout_how = "; ".join(timeouts)
    elif specs:
        timeout_how = "the env's spec names none, so always 0"
    else:
        timeout_how = "an error kind the env's spec names in timeout_errors"
    definitions = {
        "key_action_accuracy": f"Expected key actions performed by a valid action (multiset match; {key_how}) "
                               "/ expected key actions, pooled over episodes.",
        "tool_timeout_rate": f"Episodes with at least one tool timeout ({timeout_how}) / episodes.",
    }
    return tuple(dataclasses.replace(m, definition=definitions[m.name]) if m.name in definitions else m
                 for m in METRICS)


def metrics_for(records: Sequence[dict[str, Any]]) -> tuple[MetricSpec, ...]:
    """Every metric a report on ``records`` shows: :data:`METRICS` (their definitions' examples taken from the
    records' environments, :func:`described_for`), then those environments' own, then their cost terms'."""
    env_ids = [r.get("env_id") for r in records]
    specs = [s for s in (R.env_spec_of({"env_id": e}) for e in dict.fromkeys(env_ids)) if s is not None]
    return described_for(specs) + env_metric_specs(env_ids) + cost_metric_specs(records)


def _flat_mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


@dataclass
class MetricValue:
    """A metric's value with its 95% interval (``lo``/``hi``, None when undefined) and sample size.

    ``count`` is ``(k, n)`` for proportions of episodes; ``se`` the jackknife
    standard error of jackknife metrics.
    """

    value: float | None
    lo: float | None = None
    hi: float | None = None
    n: int = 0
    count: tuple[int, int] | None = None
    se: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "n": self.n,
                "count": list(self.count) if self.count else None, "se": self.se}


@dataclass
class PolicyMetrics:
    """All metric values of one policy, plus the bootstrap replicates used to compare it."""

    values: dict[str, MetricValue]
    stats: list[EpisodeStats]
    boots: dict[str, np.ndarray] = field(default_factory=dict, repr=False)


def _bootstrap(spec: MetricSpec, eps: Sequence[EpisodeStats], *, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, sum(map(ord, spec.name))])
    n = len(eps)
    if n == 0:
        return np.full(n_boot, np.nan)
    idx = rng.integers(0, n, (n_boot, n))
    num, den = getattr(spec.stat, "num", None), getattr(spec.stat, "den", None)
    if num is not None and den is not None:
        a = np.array([num(e) for e in eps], float)[idx].sum(1)
        b = np.array([den(e) for e in eps], float)[idx].sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(b > 0, a / np.where(b > 0, b, 1), np.nan)
    out = np.full(n_boot, np.nan)
    for r in range(n_boot):
        v = spec.stat([eps[i] for i in idx[r]])
        out[r] = np.nan if v is None else v
    return out


def compute_metrics(stats: Sequence[EpisodeStats], *, n_boot: int = 1000, seed: int = 0,
                    metrics: Sequence[MetricSpec] = METRICS) -> PolicyMetrics:
    """Every metric of ``metrics`` (default :data:`METRICS`) for one policy's episodes, with 95% intervals.

    Intervals: Wilson for ``z`` metrics, Student-t for ``welch`` metrics,
    ``+- 1.96`` jackknife s.e. for ``jackknife`` metrics, bootstrap percentiles
    (``n_boot`` resamples of episodes, seeded) otherwise.
    """
    stats = list(stats)
    values: dict[str, MetricValue] = {}
    boots: dict[str, np.ndarray] = {}
    for spec in metrics:
        v = spec.stat(stats)
        if spec.counts is not None:
            k, n = spec.counts(stats)
            lo, hi = wilson_interval(k, n) if n else (None, None)
            values[spec.name] = MetricValue(v, lo, hi, n, (k, n))
        elif spec.samples is not None:
            s = spec.samples(stats)
            ci = t_interval(s)
            values[spec.name] = MetricValue(v, *(ci or (None, None)), n=len(s))
        elif spec.test == "jackknife":
            se = jackknife_se(spec.stat.loo(stats)) if v is not None else None  # type: ignore[attr-defined]
            lo, hi = (v - Z95 * se, v + Z95 * se) if v is not None and se is not None else (None, None)
            values[spec.name] = MetricValue(v, lo, hi, n=len(stats), se=se)
        else:
            b = _bootstrap(spec, stats, n_boot=n_boot, seed=seed) if v is not None else np.full(n_boot, np.nan)
            boots[spec.name] = b
            ci = bootstrap_interval(b) if v is not None else None
            values[spec.name] = MetricValue(v, *(ci or (None, None)), n=len(stats))
    return PolicyMetrics(values=values, stats=stats, boots=boots)


@dataclass
class Comparison:
    """``policy - baseline`` on one metric, with the test used and its two-sided p-value."""

    metric: str
    policy: str
    baseline: str
    diff: float | None
    p: float | None
    test: Test

    @property
    def significant(self) -> bool:
        """p < 0.05 (two-sided)."""
        return self.p is not None and self.p < 0.05

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (with ``significant``)."""
        return {"metric": self.metric, "policy": self.policy, "baseline": self.baseline, "diff": self.diff,
                "p": self.p, "test": self.test, "significant": self.significant}


def compare(spec: MetricSpec, base: PolicyMetrics, other: PolicyMetrics, *, names: tuple[str, str]) -> Comparison:
    """Test ``other - base`` on ``spec`` (``names`` = (baseline name, policy name))."""
    a, b = base.values[spec.name].value, other.values[spec.name].value
    diff = None if a is None or b is None else b - a
    p: float | None = None
    if diff is not None:
        if spec.counts is not None:
            p = two_proportion_z(spec.counts(base.stats), spec.counts(other.stats))[1]
        elif spec.samples is not None:
            p = welch_t(spec.samples(base.stats), spec.samples(other.stats))[1]
        elif spec.test == "jackknife":
            p = z_from_se(diff, base.values[spec.name].se, other.values[spec.name].se)
        else:
            p = bootstrap_p(base.boots[spec.name], other.boots[spec.name])
    if p is not None and math.isnan(p):
        p = None
    return Comparison(spec.name, names[1], names[0], diff, p, spec.test)
