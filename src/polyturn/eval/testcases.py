"""Test-case files: which tasks an evaluation runs.

A test-case file is JSON (a list of cases, or ``{"cases": [...]}``) or JSONL
(one case a line). Each case::

    {"id": "sql-s17",                       # optional; default "<index>"
     "env": "polyturn/SQLAnalyst-v0",       # env id (required)
     "seed": 17,                            # the task seed ...
     "options": {"task_id": "sql-L3-s17"},  # ... and/or explicit reset options
     "env_kwargs": {},                      # optional gymnasium.make kwargs
     "expected_key_actions": ["inspect_schema", "run_sql", "submit_answer"]}   # optional

:func:`make_test_cases` writes one from a seed range, taking the expected key
actions from each task's ``key_actions`` (reset info).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.acting.registry import make_env

_FIELDS = {"id", "env", "seed", "options", "env_kwargs", "expected_key_actions", "task_id", "level", "ambiguous"}


@dataclass(frozen=True)
class TestCase:
    """One task to evaluate on (see the module docstring for the file format)."""

    __test__ = False  # not a pytest test class

    id: str
    env: str
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    expected_key_actions: list[str] | None = None

    def task(self) -> dict[str, Any]:
        """The ``{"seed", "options"}`` dict that :meth:`polyturn.rollout.collector.Collector.collect` takes."""
        return {"seed": self.seed, "options": dict(self.options)}

    def env_group(self) -> str:
        """Cases with the same group run in the same environments (env id plus kwargs)."""
        return self.env + json.dumps(self.env_kwargs, sort_keys=True)


def _case(raw: Any, index: int, source: Path) -> TestCase:
    where = f"{source} case {index}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: Expected a JSON object, got {type(raw).__name__}")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ValueError(f"{where}: Expected fields among {sorted(_FIELDS)}, got unknown {sorted(unknown)}")
    if not isinstance(raw.get("env"), str) or not raw["env"]:
        raise ValueError(f'{where}: Expected "env": "<env id>" (e.g. "polyturn/SQLAnalyst-v0"), got {raw.get("env")!r}')
    seed, options = raw.get("seed"), raw.get("options") or {}
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"{where}: Expected an integer seed, got {seed!r}")
    if not isinstance(options, dict):
        raise ValueError(f"{where}: Expected options as an object, got {type(options).__name__}")
    if seed is None and not options:
        raise ValueError(f'{where}: Expected a "seed" or explicit "options" (e.g. {{"task_id": ...}}), got neither')
    keys = raw.get("expected_key_actions")
    if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
        raise ValueError(f"{where}: Expected expected_key_actions as a list of names, got {keys!r}")
    kwargs = raw.get("env_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"{where}: Expected env_kwargs as an object, got {type(kwargs).__name__}")
    return TestCase(id=str(raw.get("id", index)), env=raw["env"], seed=seed, options=dict(options),
                    env_kwargs=dict(kwargs), expected_key_actions=list(keys) if keys is not None else None)


def load_test_cases(path: str | Path) -> list[TestCase]:
    """Read and validate a JSON or JSONL test-case file (ids must be unique)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Expected a test-case file at {path}, found none; write one with "
            f"`polyturn make-test-cases --env polyturn/SQLAnalyst-v0 --seeds 0:50 --out {path}`"
        )
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: Expected a UTF-8 JSON or JSONL test-case file, got bytes that are not UTF-8 "
                         f"({e.reason})") from None
    except json.JSONDecodeError:
        data = read_jsonl(path)  # not one JSON document: one case a line
    if isinstance(data, dict) and "cases" in data:
        data = data["cases"]
    elif isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: Expected a non-empty list of test cases, got {type(data).__name__} of length "
                         f"{len(data) if hasattr(data, '__len__') else 0}")
    cases = [_case(raw, i, path) for i, raw in enumerate(data)]
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise ValueError(f"{path}: Expected unique case ids, got {c.id!r} twice")
        seen.add(c.id)
    return cases


def parse_seed_range(spec: str) -> range:
    """``"A:B"`` -> ``range(A, B)`` (B excluded, like Python slices); ``"A"`` -> ``range(A, A + 1)``.

    >>> list(parse_seed_range("3:6"))
    [3, 4, 5]
    """
    try:
        if ":" in spec:
            a, b = (int(x) for x in spec.split(":", 1))
        else:
            a = int(spec)
            b = a + 1
    except ValueError:
        raise ValueError(f"Expected seeds as A:B (e.g. 0:50), got {spec!r}") from None
    if b <= a or a < 0:
        raise ValueError(f"Expected seeds A:B with 0 <= A < B, got {spec!r}")
    return range(a, b)


def make_test_cases(
    env_id: str, seeds: str | range, out: str | Path, *, env_kwargs: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Write a JSONL test-case file for ``seeds`` (``"A:B"``, B excluded) of ``env_id``; returns the cases.

    Each case records the task id, level and ambiguity for reading, and the
    env's ``key_actions`` as ``expected_key_actions``.
    """
    rng = parse_seed_range(seeds) if isinstance(seeds, str) else seeds
    env = make_env(env_id, env_kwargs)
    cases = []
    try:
        for s in rng:
            _, info = env.reset(seed=s)
            cases.append({
                "id": f"{info['task_id']}@s{s}" if info.get("task_id") else f"s{s}",
                "env": env_id, "seed": s, "options": {},
                **({"env_kwargs": env_kwargs} if env_kwargs else {}),
                "expected_key_actions": list(info.get("key_actions", [])),
                "task_id": info.get("task_id"), "level": info.get("level"), "ambiguous": info.get("ambiguous"),
            })
    finally:
        env.close()
    write_jsonl(out, cases)
    return cases
