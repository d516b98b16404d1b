"""``polyturn evaluate``: run policies on the same test cases and write the report.

Output directory layout::

    episodes/<policy>.jsonl   one episode record per test case (docs/ARCHITECTURE.md + case_id, crashed, latency)
    metrics.json              every number of the report
    report.md                 the report (always)
    report.html, figures/     with visualize: the same report with figures, self-contained

Determinism: actor policies decode greedily at temperature 0; at temperature
> 0 a ``torch.Generator`` seeded with ``seed`` drives sampling, so the same
seed, cases and ``num_envs`` give the same episodes. Text policies are built
afresh per case from ``seed`` and the case index.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from polyturn.acting.checkpoint import load_checkpoint, run_actor
from polyturn.acting.episodes import episode_head, exception_text, run_episode
from polyturn.acting.jsonl import write_jsonl
from polyturn.acting.policies import PolicySpec, make_text_policy, resolve_policy, unique_labels
from polyturn.acting.registry import make_env
from polyturn.eval.embed import Embedder, MiniLMEmbedder, torch_threads
from polyturn.eval.report import ReportData, build_report, write_report
from polyturn.eval.testcases import TestCase, load_test_cases
from polyturn.rollout.best_of import deployable_scorer

Progress = Callable[[int], None]


def crash_record(case: TestCase, *, policy: str, error: BaseException) -> dict[str, Any]:
    """The record of an episode that raised before it could finish."""
    head = episode_head(env_id=case.env, seed=case.seed, policy=policy, info={})
    return head | {"crashed": True, "crash": exception_text(error)}


def _make_env(case: TestCase) -> gym.Env:
    return make_env(case.env, case.env_kwargs)


def _annotate(rec: dict[str, Any], case: TestCase) -> dict[str, Any]:
    rec["case_id"] = case.id
    rec.setdefault("crashed", False)
    if case.expected_key_actions is not None:
        rec["expected_key_actions"] = list(case.expected_key_actions)
    return rec


def _groups(cases: Sequence[TestCase]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        out.setdefault(c.env_group(), []).append(i)
    return out


def run_text_policy(
    spec: PolicySpec, cases: Sequence[TestCase], *, seed: int, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Run ``expert`` or ``random`` on every case, one step at a time (records in case order)."""
    out: list[dict[str, Any] | None] = [None] * len(cases)
    for idx in _groups(cases).values():
        env = _make_env(cases[idx[0]])
        try:
            for i in idx:
                policy = make_text_policy(spec.kind, env, seed=seed * 1_000_003 + i)  # type: ignore[arg-type]
                rec = run_episode(env, policy, seed=cases[i].seed, options=cases[i].options, label=spec.label,
                                  for_eval=True)
                out[i] = _annotate(rec, cases[i])
                if progress:
                    progress(1)
        finally:
            env.close()
    return [r for r in out if r is not None]


def run_actor_policy(
    spec: PolicySpec,
    cases: Sequence[TestCase],
    *,
    temperature: float,
    seed: int,
    num_envs: int,
    progress: Progress | None = None,
    best_of: int = 1,
    scorer: Callable[[Sequence[Any]], Sequence[float]] | None = None,
) -> list[dict[str, Any]]:
    """Run a checkpoint's actor on every case through the batched :class:`Collector`.

    ``best_of`` > 1 plays ``scorer``'s favourite of that many sampled candidate turns at each state.

    Uses the checkpoint's rollout settings (``rollout`` section of its
    config). If a batch raises, its cases are rerun one at a time so that one
    crashing case is recorded (``crashed``) without sinking the others.
    """
    ckpt = load_checkpoint(spec)
    out: list[dict[str, Any] | None] = [None] * len(cases)
    with torch_threads(1):
        for idx in _groups(cases).values():
            envs = [_make_env(cases[idx[0]]) for _ in range(max(1, min(num_envs, len(idx))))]
            env_id = cases[idx[0]].env
            done = [0]

            def counted(n: int) -> None:
                done[0] += n
                if progress:
                    progress(n)

            try:
                collector = ckpt.collector([e.unwrapped for e in envs], env_id=env_id, best_of=best_of, scorer=scorer)
                try:
                    eps = run_actor(collector, [cases[i].task() for i in idx], temperature=temperature, seed=seed,
                                    progress=counted, label=spec.label)
                    for i, ep in zip(idx, eps):
                        out[i] = _annotate(ep.to_record(), cases[i])
                except Exception:  # noqa: BLE001  (rerun one by one to find and record the crashing case)
                    single = ckpt.collector([envs[0].unwrapped], env_id=env_id, best_of=best_of, scorer=scorer)
                    for j, i in enumerate(idx):
                        try:
                            ep = run_actor(single, [cases[i].task()], temperature=temperature,
                                           seed=seed * 1_000_003 + i, label=spec.label)[0]
                            out[i] = _annotate(ep.to_record(), cases[i])
                        except Exception as e:  # noqa: BLE001
                            out[i] = _annotate(crash_record(cases[i], policy=spec.label, error=e), cases[i])
                        if progress and j >= done[0]:  # episodes already counted by the failed batch
                            progress(1)
            finally:
                for e in envs:
                    e.close()
    return [r for r in out if r is not None]


def evaluate(
    policies: Sequence[str],
    test_cases: str | Path,
    *,
    out_dir: str | Path,
    visualize: bool,
    temperature: float = 0.0,
    seed: int = 0,
    num_envs: int = 16,
    progress: Progress | None = None,
    baseline: str | None = None,
    compare_to: Sequence[str] | None = None,
    embedder: Embedder | None | str = "minilm",
    n_boot: int = 1000,
    best_of: int = 1,
    critic: str | Path | None = None,
    oracle: bool = False,
) -> ReportData:
    """Run every policy on the same test cases, then write episodes, metrics and the report.

    Args:
        policies: checkpoint directories, actor directories, or ``expert`` / ``random``.
        test_cases: a JSON/JSONL test-case file (:mod:`polyturn.eval.testcases`).
        out_dir: where ``episodes/``, ``metrics.json``, ``report.md`` (and with
            ``visualize``: ``report.html``, ``figures/``) are written.
        visualize: also draw the figures and write the HTML report.
        temperature: 0 decodes greedily; above 0 samples (seeded by ``seed``).
        seed: fixes sampling, the random policy and the bootstraps.
        num_envs: conversations an actor runs in one batch.
        progress: called with 1 after each finished episode (all policies together).
        baseline: the policy the differences are taken against (default: the first).
        compare_to: policies compared with the baseline (default: all others).
        embedder: ``"minilm"`` (default), any :class:`Embedder`, or None to skip
            coherence and embedding clusters.
        n_boot: bootstrap resamples for intervals and tests.
        best_of: above 1, each checkpoint plays the action critic's favourite of that many candidate turns;
            its rows are labelled ``[best-of-N]``.
        critic: the action critic for ``best_of`` (default: each checkpoint's own ``critic/``).
        oracle: allow a critic that reads privileged text (refused otherwise: that text does not exist at
            deployment); the rows are labelled ``[best-of-N oracle]``.

    Returns:
        The :class:`ReportData` that was rendered.
    """
    if not policies:
        raise ValueError("Expected at least one policy (a checkpoint directory, expert or random), got none")
    if temperature < 0:
        raise ValueError(f"Expected temperature >= 0, got {temperature}")
    if num_envs < 1:
        raise ValueError(f"Expected num_envs >= 1, got {num_envs}")
    if isinstance(embedder, str) and embedder != "minilm":
        raise ValueError(f"Expected embedder 'minilm', an Embedder or None, got {embedder!r}")
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"Expected --out to be a directory, got the file {out_dir}")
    if best_of < 1:
        raise ValueError(f"Expected best_of >= 1, got {best_of}")
    cases = load_test_cases(test_cases)
    specs = [resolve_policy(p) for p in policies]
    unique_labels(specs)
    scorers = {}
    if best_of > 1:
        specs, scorers = _best_of_specs(specs, best_of=best_of, critic=critic, oracle=oracle)
    labels = [s.label for s in specs]
    if baseline is not None and baseline not in labels:
        raise ValueError(f"Expected --baseline among the policy names {labels}, got {baseline!r}")
    unknown = [p for p in (compare_to or []) if p not in labels]
    if unknown:
        raise ValueError(f"Expected --compare names among the policy names {labels}, got {unknown}")
    out = Path(out_dir)
    records: dict[str, list[dict[str, Any]]] = {}
    for spec in specs:
        if spec.kind == "actor":
            recs = run_actor_policy(spec, cases, temperature=temperature, seed=seed, num_envs=num_envs,
                                    progress=progress, best_of=best_of, scorer=scorers.get(spec.label))
        else:
            recs = run_text_policy(spec, cases, seed=seed, progress=progress)
        records[spec.label] = recs
        write_jsonl(out / "episodes" / f"{_file_name(spec.label)}.jsonl", recs)
    emb = MiniLMEmbedder() if embedder == "minilm" else embedder
    data = build_report(
        records,
        title="polyturn evaluation report",
        sources={s.label: _source(s) for s in specs},
        meta={"test_cases": str(test_cases), "cases": len(cases), "seed": seed,
              "decoding": "greedy (temperature 0)" if temperature == 0 else f"sampled, temperature {temperature:g}",
              "num_envs": num_envs, **({"best_of": best_of, "oracle": oracle} if best_of > 1 else {}), "created": _dt.datetime.now().isoformat(timespec="seconds")},
        embedder=emb,  # type: ignore[arg-type]
        baseline=baseline,
        compare_to=compare_to,
        n_boot=n_boot,
        seed=seed,
    )
    write_report(data, out, visualize=visualize)
    return data


def _best_of_specs(specs: Sequence[PolicySpec], *, best_of: int, critic: str | Path | None,
                   oracle: bool) -> tuple[list[PolicySpec], dict[str, Any]]:
    """Checkpoints relabelled ``[best-of-N]`` (``[best-of-N oracle]``) with their critics' scorers, by label.

    Loading a critic that reads privileged text without ``oracle`` raises
    :class:`polyturn.rollout.best_of.PrivilegedCriticError` before any episode runs.
    """
    out, scorers = [], {}
    for spec in specs:
        if spec.kind != "actor" or spec.actor_dir is None:
            out.append(spec)
            continue
        source = str(critic) if critic is not None else str(spec.actor_dir.parent)
        scorer = deployable_scorer(source, oracle=oracle)
        tag = f"best-of-{best_of} oracle" if scorer.privileged else f"best-of-{best_of}"
        spec = dataclasses.replace(spec, label=f"{spec.label} [{tag}]")
        scorers[spec.label] = scorer
        out.append(spec)
    return out, scorers


def _source(spec: PolicySpec) -> str:
    if spec.actor_dir is None:
        return f"built-in {spec.kind} policy"
    return str(spec.actor_dir.parent if spec.actor_dir.name == "actor" else spec.actor_dir)


def _file_name(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
