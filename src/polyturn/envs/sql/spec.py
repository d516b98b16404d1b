"""The spec of ``polyturn/SQLAnalyst-v0`` (:class:`polyturn.envs.spec.EnvSpec`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyturn.envs.spec import EnvSpec, Subgoal


def answer_kind(args: Mapping[str, Any]) -> str:
    """The type of a submitted answer (``args["answer"]``): ``number``, ``list``, ``text`` or ``other``.

    >>> answer_kind({"answer": 3.5}), answer_kind({"answer": ["a"]}), answer_kind({"answer": "Fridge"})
    ('number', 'list', 'text')
    """
    answer = args.get("answer")
    if isinstance(answer, bool):
        return "other"
    if isinstance(answer, (int, float)):
        return "number"
    if isinstance(answer, (list, tuple)):
        return "list"
    if isinstance(answer, str):
        try:
            float(answer.replace(",", ""))
            return "number"
        except ValueError:
            return "text"
    return "other"


SPEC = EnvSpec(
    id="polyturn/SQLAnalyst-v0",
    entry_point="polyturn.envs.sql.env:SQLAnalystEnv",
    expert="polyturn.envs.sql.expert:SQLExpert",
    task_description="an AI data analyst answering a user's request by calling tools "
                     "(list_tables, describe_table, run_sql, ask_user, plot, submit_answer)",
    key_actions={"inspect_schema": ("list_tables", "describe_table"), "ask_user": ("ask_user",),
                 "run_sql": ("run_sql",), "plot": ("plot",), "submit_answer": ("submit_answer",),
                 "remember": ("remember",)},
    action_types=("list_tables", "describe_table", "run_sql", "ask_user", "plot", "submit_answer", "remember"),
    observation_kinds={"run_sql": "rows", "ask_user": "user_reply", "list_tables": "schema",
                       "describe_table": "schema"},
    final_action="submit_answer",
    answer_kind=answer_kind,
    timeout_errors=("sql_timeout",),
    data_files={"database": "db_path", "tasks": "tasks_path"},
    request_errors=("sqlite3:Error",),
    subgoals=(Subgoal(name="inspect", text="Inspect the schema of the tables the question needs.",
                      check="subgoal:schema_inspected"),
              Subgoal(name="clarify", text="Ask the user what they mean where the request is ambiguous.",
                      check="subgoal:clarified", when="ambiguous"),
              Subgoal(name="query", text="Query the rows the answer needs.", check="subgoal:relevant_rows"),
              Subgoal(name="answer", text="Compute the answer and submit it.", check="success")),
)
