"""Tasks from a JSONL file, for running the analyst env on any SQLite database.

One JSON object per line:

* ``question`` (str, required): the user's request, the first observation.
* ``gold_sql`` (str, required): a read-only query whose result is the gold
  answer (reduced by shape as in :mod:`polyturn.envs.sql.answers`).
* ``clarifications`` (optional): what the simulated user says when asked. Its
  presence makes the task ambiguous. Either a string (the reply to any
  question), a list of ``{"trigger": str, "reply": str}`` objects, or a dict
  ``{trigger: reply}``; the user answers with the reply of every trigger that
  occurs in the agent's question (case-insensitive), or with all replies when
  none does.
* ``difficulty`` (int 1-5, optional, default 1): the task's level.
* ``id`` (str, optional): the task id; default ``<file stem>-<line number>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polyturn.envs.sql.answers import gold_from_result, has_top_level_order_by
from polyturn.envs.sql.sandbox import Sandbox
from polyturn.envs.sql.tasks import Task

_FIELDS = {"question", "gold_sql", "clarifications", "difficulty", "id"}


def _clarifications(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (("", value),)
    if isinstance(value, dict):
        value = [{"trigger": k, "reply": v} for k, v in value.items()]
    if isinstance(value, list) and all(
        isinstance(item, dict) and isinstance(item.get("trigger"), str) and isinstance(item.get("reply"), str)
        for item in value
    ):
        return tuple((item["trigger"], item["reply"]) for item in value)
    raise ValueError(
        f"{where}: Expected clarifications as a string, a list of {{'trigger': str, 'reply': str}} "
        f"or a dict of trigger -> reply, got {value!r}"
    )


def load_task_file(path: str | Path, sandbox: Sandbox) -> list[Task]:
    """Read and validate a task file; every gold query is run once to compute its gold answer."""
    path = Path(path)
    tasks: list[Task] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: Expected a JSON object, got invalid JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise ValueError(f"{where}: Expected a JSON object, got {type(record).__name__}")
        unknown = set(record) - _FIELDS
        if unknown:
            raise ValueError(f"{where}: Expected fields among {sorted(_FIELDS)}, got unknown {sorted(unknown)}")
        question, sql = record.get("question"), record.get("gold_sql")
        if not (isinstance(question, str) and question.strip() and isinstance(sql, str) and sql.strip()):
            raise ValueError(f"{where}: Expected non-empty string fields 'question' and 'gold_sql'")
        level = record.get("difficulty", 1)
        if not isinstance(level, int) or not 1 <= level <= 5:
            raise ValueError(f"{where}: Expected difficulty as an int from 1 to 5, got {level!r}")
        task_id = str(record.get("id") or f"{path.stem}-{lineno}")
        if task_id in seen:
            raise ValueError(f"{where}: Expected unique task ids, got {task_id!r} twice")
        seen.add(task_id)
        result = sandbox.run(sql, max_rows=10_000, timed=False)
        if result.error:
            raise ValueError(f"{where}: Expected gold_sql to run, got {result.message}")
        clar = _clarifications(record.get("clarifications"), where)
        tasks.append(
            Task(
                task_id=task_id,
                level=level,
                question=question.strip(),
                gold_sql=sql,
                gold=gold_from_result(result.rows, ordered=has_top_level_order_by(sql)),
                gold_tables=result.tables,
                key_actions=("inspect_schema", *(("ask_user",) if clar else ()), "run_sql", "submit_answer"),
                intent=" ".join(reply for _, reply in clar),
                clarifications=clar,
            )
        )
    if not tasks:
        raise ValueError(f"Expected at least one task in {path}, got an empty file")
    return tasks
