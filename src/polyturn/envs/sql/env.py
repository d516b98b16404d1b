"""``polyturn/SQLAnalyst-v0``: a data query and analysis agent over a SQLite database.

The user asks an analysis question ("Which 3 products had the highest revenue
in East China in 2024-Q3?"); the agent inspects the schema, asks the user when
the request is ambiguous, queries, optionally plots, and submits an answer.

Tools (ReAct actions, see :mod:`polyturn.envs.actions`):

* ``list_tables[{}]``, ``describe_table[{"table": ...}]``
* ``run_sql[{"sql": ...}]``: read-only, time-boxed (:mod:`.sandbox`), at most 20 rows shown
* ``ask_user[{"question": ...}]``: the simulated user answers from the hidden intent
* ``plot[{"kind": "bar"|"line", "title": ..., "x": [...], "y": [...]}]`` or ``{"from_last_result": true}``
* ``submit_answer[{"answer": ...}]`` or ``{"from_last_result": true}`` (the last query's rows are the
  answer, as an analyst hands over a query result): ends the episode; graded by :mod:`.answers`
* ``remember[{"note": ...}]``

Reward terms: the base ones (:mod:`polyturn.envs.rewards`) and this env's own
(:class:`SQLAnalystWeights`): three sub-goals and the sandbox penalty. Its one
cost term, beside the reward (``info["cost_terms"]``): ``cost/sandbox``, 1 on a
step whose query the sandbox refused or cut off.

Two modes: by default tasks are generated (:mod:`.tasks`) on a sales database
generated from ``db_seed`` (:mod:`.database`); with ``tasks_path`` the tasks
come from a JSONL file (:mod:`.task_file`) over ``db_path`` (any SQLite file).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from polyturn.envs.base import BadArgs, EpisodeStart, ToolEnv, ToolResult, check_levels, require_str
from polyturn.envs.rewards import RewardWeights, StepEvents
from polyturn.envs.sql.answers import answers_match
from polyturn.envs.sql.database import is_sales_db, sales_db_path, write_sales_db
from polyturn.envs.sql.plot import ChartSpecError, chart_data, render_chart
from polyturn.envs.sql.sandbox import Sandbox, format_result, format_value
from polyturn.envs.sql.task_file import load_task_file
from polyturn.envs.sql.tasks import LEVELS, Catalog, Task, generate_task, parse_task_id

TOOL_HELP = {
    "list_tables": "list_tables[{}]: list the tables and views.",
    "describe_table": 'describe_table[{"table": "sales"}]: columns, an example row, '
    "and the values of short text columns.",
    "run_sql": 'run_sql[{"sql": "SELECT ..."}]: run one read-only SQLite query; shows at most 20 rows.',
    "ask_user": 'ask_user[{"question": "..."}]: ask the user to clarify the request.',
    "plot": 'plot[{"kind": "bar", "title": "...", "x": [...], "y": [...]}]: draw a chart; '
    '{"kind": "line", "from_last_result": true} plots the last query (first column vs last).',
    "submit_answer": 'submit_answer[{"answer": ...}]: give the final answer (a number, a name, or a list); '
    '{"from_last_result": true} submits the rows of the last query as the answer. Ends the task.',
}
_DESCRIPTIONS: dict[tuple[str, str], str] = {}  # (db path, table) -> describe_table text
_TYPE_NAMES = {int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"}


class SQLAnalystWeights(RewardWeights):
    """The base reward weights plus this env's terms; ``subgoal/*`` come right after ``outcome/*`` (group order)."""

    subgoal_schema_inspected: float = Field(0.2, ge=0, description="First table description seen.")
    subgoal_clarified: float = Field(0.2, ge=0, description="Hidden intent of an ambiguous task learnt.")
    subgoal_relevant_rows: float = Field(0.1, ge=0, description="First query returning rows from the gold tables.")
    penalty_sandbox: float = Field(-0.3, le=0, description="Query refused or timed out.")


SQL_FEATURES = ("schema_inspected", "asked_user", "clarified", "rows_seen", "n_sql", "n_sql_errors", "plotted", "notes")


class SQLAnalystEnv(ToolEnv):
    """Data query and analysis env (see the module docstring).

    Args:
        db_seed: seed of the generated sales database (ignored when ``db_path`` is given).
        db_path: an SQLite file. Without ``tasks_path`` it must be a sales database
            (it is generated there from ``db_seed`` if missing); with ``tasks_path`` any file.
        tasks_path: JSONL task file (generic mode).
        level: default level(s) tasks are drawn from (1-5); the ``level`` reset option overrides it.
        ambiguous_frac: share of level 2-4 tasks that need a clarifying question.
        max_turns: turns before truncation.
        reward_weights: weights of :class:`SQLAnalystWeights` (a mapping of term names or fields, or an instance).
        time_budget_s: per-query CPU-time limit of the sandbox (the agent's queries only).
        max_rows: rows shown per query.
        plot_dir: where charts are written (default: a temporary folder made on first use and removed by
            :meth:`close`, or when the env is garbage-collected or the interpreter exits); the ``plot``
            observation names the file relative to it.
        render_plots: draw chart files; ``False`` checks the chart spec and answers the same
            observation without drawing (training rollouts need no file; drawing was the costliest env step).
        render_mode: ``None`` or ``"ansi"``.
    """

    weights_class = SQLAnalystWeights
    cost_names = ("cost/sandbox",)

    def __init__(
        self,
        *,
        db_seed: int = 0,
        db_path: str | Path | None = None,
        tasks_path: str | Path | None = None,
        level: int | Sequence[int] | None = None,
        ambiguous_frac: float = 0.4,
        max_turns: int = 8,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        time_budget_s: float = 1.0,
        max_rows: int = 20,
        plot_dir: str | Path | None = None,
        render_plots: bool = True,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns, reward_weights=reward_weights, render_mode=render_mode)
        if not 0.0 <= ambiguous_frac <= 1.0:
            raise ValueError(f"Expected ambiguous_frac in [0, 1], got {ambiguous_frac}")
        self.levels = check_levels(LEVELS if level is None else level, LEVELS)
        self.ambiguous_frac = ambiguous_frac
        if db_path is None:
            path = sales_db_path(db_seed)
        else:
            path = Path(db_path)
            if tasks_path is None and not path.exists():
                write_sales_db(path, db_seed)
        self.db_path = path.resolve()
        self.sandbox = Sandbox(self.db_path, time_budget_s=time_budget_s, max_rows=max_rows)
        self.catalog: Catalog | None = None
        self.task_pool: list[Task] = []
        try:
            if tasks_path is not None:
                self.task_pool = load_task_file(tasks_path, self.sandbox)
            elif is_sales_db(self.db_path):
                self.catalog = Catalog.from_sandbox(self.sandbox)
            else:
                raise ValueError(
                    f"Expected a polyturn sales database at {self.db_path}, got a file without the `sales` view; "
                    "pass tasks_path to use another database"
                )
        except BaseException:
            self.sandbox.close()
            raise
        self.plot_dir = Path(plot_dir) if plot_dir is not None else None
        self._remove_plot_dir: weakref.finalize | None = None  # for a folder the env made itself
        self.render_plots = render_plots
        self.tools = {
            "list_tables": self._list_tables,
            "describe_table": self._describe_table,
            "run_sql": self._run_sql,
            "ask_user": self._ask_user,
            "plot": self._plot,
            "submit_answer": self._submit_answer,
            "remember": self.tools["remember"],
        }
        self.tool_help |= TOOL_HELP
        self.task: Task | None = None
        self._reset_task_state()

    def _reset_task_state(self) -> None:
        self._flags = dict.fromkeys(SQL_FEATURES, 0.0)
        # The last run_sql call's columns and rows (rows may be empty); None before any query and after a
        # query that failed, so from_last_result never reaches back past the query the agent just ran.
        self._last_result: tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]] | None = None
        self._last_query_failed = False

    # ----- episode ----------------------------------------------------------------------------
    def _new_task(self, seed: int, options: Mapping[str, Any]) -> EpisodeStart:
        task = self._pick_task(seed, options)  # first: a bad task_id or level changes nothing
        self._reset_task_state()
        self.task = task
        return EpisodeStart(
            task_id=self.task.task_id,
            question=self.task.question,
            level=self.task.level,
            ambiguous=self.task.ambiguous,
            privileged=self.task.privileged(),
            key_actions=self.task.key_actions,
        )

    def _pick_task(self, seed: int, options: Mapping[str, Any]) -> Task:
        task_id = options.get("task_id")
        levels = self.levels if options.get("level") is None else check_levels(options["level"], LEVELS)
        if self.catalog is None:  # generic mode: a task file
            if task_id is not None:
                for task in self.task_pool:
                    if task.task_id == task_id:
                        return task
                n = len(self.task_pool)
                raise ValueError(f"Expected a task_id from the {n} tasks of the task file, got {task_id!r}")
            pool = [t for t in self.task_pool if t.level in levels]
            if not pool:
                raise ValueError(f"Expected tasks at levels {levels} in the task file, got none")
            return pool[random.Random(f"polyturn-pick-{seed}").randrange(len(pool))]
        if task_id is not None:
            parsed = parse_task_id(str(task_id))
            if parsed is None:
                raise ValueError(f"Expected a task_id like 'sql-L3-s17', got {task_id!r}")
            level, seed = parsed
        else:
            level = levels[random.Random(f"polyturn-level-{seed}").randrange(len(levels))]
        return generate_task(self.sandbox, self.catalog, seed=seed, level=level, ambiguous_frac=self.ambiguous_frac)

    def _task_features(self) -> dict[str, float]:
        return dict(self._flags)

    def close(self) -> None:
        """Close the database connection and remove the plot folder the env made (a given ``plot_dir`` stays)."""
        self.sandbox.close()
        if self._remove_plot_dir is not None:
            self._remove_plot_dir()
            self._remove_plot_dir, self.plot_dir = None, None
        super().close()

    # ----- tools ------------------------------------------------------------------------------
    def _schema_objects(self) -> list[tuple[str, str]]:
        """(name, 'table' | 'view') of the user-visible schema objects, sorted by name."""
        rows = self.sandbox.run(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name",
            max_rows=200, timed=False,
        ).rows
        return [(str(name), str(kind)) for name, kind in rows]

    def _list_tables(self, args: dict[str, Any]) -> ToolResult:
        if args:
            raise BadArgs(f"Expected no args ({{}}), got {sorted(args)}")
        objects = self._schema_objects()
        tables = ", ".join(n for n, t in objects if t == "table") or "(none)"
        views = ", ".join(n for n, t in objects if t == "view")
        return ToolResult(f"Tables: {tables}" + (f"\nViews: {views}" if views else ""))

    def _describe_table(self, args: dict[str, Any]) -> ToolResult:
        name = require_str(args, "table", max_len=200).strip()
        known = dict(self._schema_objects())
        match = next((k for k in known if k.lower() == name.lower()), None)
        if match is None:
            raise BadArgs(f"Expected a table from list_tables ({', '.join(sorted(known))}), got {name!r}")
        key = (str(self.db_path), match)
        if key not in _DESCRIPTIONS:
            # Shared by every env on the same (read-only) file: the DISTINCT scans cost ~0.1 s per table.
            _DESCRIPTIONS[key] = self._description(match, known[match])
        self.achieve("schema_inspected")
        self._flags["schema_inspected"] = 1.0
        return ToolResult(_DESCRIPTIONS[key])

    def _description(self, table: str, kind: str) -> str:
        quoted = '"' + table.replace('"', '""') + '"'
        cols = self.sandbox.run(f"PRAGMA table_info({quoted})", max_rows=200, timed=False).rows
        example = self.sandbox.run(f"SELECT * FROM {quoted} LIMIT 1", timed=False).rows
        # A view column computed by an expression has no declared type; name the type of its example value.
        types = [c[2] or (_TYPE_NAMES.get(type(example[0][i]), "") if example else "") for i, c in enumerate(cols)]
        header = ", ".join(f"{c[1]} {t}".strip() for c, t in zip(cols, types))
        lines = [f"{table} ({kind}): {header}"]
        if example:
            lines.append("Example: " + " | ".join(format_value(v) for v in example[0]))
        for c in cols:
            if c[2].upper() != "TEXT":
                continue
            col = '"' + c[1].replace('"', '""') + '"'
            values = self.sandbox.run(f"SELECT DISTINCT {col} FROM {quoted} ORDER BY 1 LIMIT 9", max_rows=9,
                                      timed=False).rows
            if 1 < len(values) <= 8:
                lines.append(f"{c[1]} values: " + ", ".join(format_value(v[0]) for v in values))
        return "\n".join(lines)

    def _cost_terms(self, ev: StepEvents, error: str | None) -> dict[str, float]:
        """``cost/sandbox``: 1 when the sandbox refused the step's query or it timed out (``penalty/sandbox``'s
        event, reported apart from the reward)."""
        return {"cost/sandbox": float(ev.sandbox_violation)}

    def _run_sql(self, args: dict[str, Any]) -> ToolResult:
        sql = require_str(args, "sql", max_len=4000)
        self._flags["n_sql"] += 1
        result = self.sandbox.run(sql)
        self._last_query_failed = bool(result.error)
        self._last_result = None if result.error else (result.columns, result.rows)
        if result.error:
            self._flags["n_sql_errors"] += 1
            violation = result.error in ("sandbox_denied", "sql_timeout")
            return ToolResult(result.message, error=result.error, sandbox_violation=violation)
        self._flags["rows_seen"] += len(result.rows)
        if result.rows:
            assert self.task is not None
            if self.task.gold_tables <= result.tables:
                self.achieve("relevant_rows")
        return ToolResult(format_result(result))

    explore_tools = ("list_tables", "describe_table", "run_sql", "ask_user", "remember")
    _EXPLORE_SQL = (
        "SELECT * FROM sales LIMIT 3",
        "SELECT DISTINCT zone FROM sales",
        "SELECT DISTINCT product FROM sales",
        "SELECT quarter, SUM(revenue) AS total FROM sales GROUP BY quarter ORDER BY quarter DESC LIMIT 4",
    )
    _EXPLORE_QUESTIONS = (
        "Do you mean by revenue or by units sold?",
        "Which period do you mean exactly?",
        "Which zone do you mean?",
    )

    def example_args(self, tool: str, rng: Any) -> dict[str, Any]:
        """Valid arguments for exploration: a real table, a harmless query, a clarifying question."""
        if tool == "describe_table":
            names = [n for n, _ in self._schema_objects()]
            return {"table": names[int(rng.integers(len(names)))]}
        if tool == "run_sql":
            return {"sql": self._EXPLORE_SQL[int(rng.integers(len(self._EXPLORE_SQL)))]}
        if tool == "ask_user":
            return {"question": self._EXPLORE_QUESTIONS[int(rng.integers(len(self._EXPLORE_QUESTIONS)))]}
        return super().example_args(tool, rng)

    def _ask_user(self, args: dict[str, Any]) -> ToolResult:
        question = require_str(args, "question", max_len=1000)
        assert self.task is not None
        self._flags["asked_user"] = 1.0
        if not self.task.ambiguous:
            return ToolResult(self.task.answer_user(question), credit=False)
        self.achieve("clarified")
        self._flags["clarified"] = 1.0
        return ToolResult(self.task.answer_user(question))

    def _plot(self, args: dict[str, Any]) -> ToolResult:
        try:
            if args.get("from_last_result") is True and self._last_result is None:
                raise ChartSpecError(self._no_result_message("plot"))
            kind, title, x, y = chart_data(args, self._last_result)
        except ChartSpecError as exc:
            raise BadArgs(str(exc)) from exc
        assert self.task is not None
        path = Path(f"{self.task.task_id}-t{self.turn}.png")
        if self.render_plots:
            if self.plot_dir is None:
                self.plot_dir = Path(tempfile.mkdtemp(prefix="polyturn-plots-"))
                # Removed by close(); an env never closed (an env list a trainer drops) is cleaned up when it is
                # collected or at exit. finalize holds the path, not the env, so it does not keep the env alive.
                self._remove_plot_dir = weakref.finalize(self, shutil.rmtree, self.plot_dir, ignore_errors=True)
            path = render_chart(kind=kind, title=title, x=x, y=y, path=self.plot_dir / path)
        self._flags["plotted"] = 1.0
        # The file name, relative to plot_dir: a temporary folder's random name would be noise in the
        # model's context and would make recorded demonstrations differ from run to run.
        return ToolResult(f"Saved a {kind} chart with {len(x)} points to {path.name}")

    def _no_result_message(self, verb: str) -> str:
        if self._last_query_failed:
            return f"Expected a query result to {verb}, but the last query failed: run_sql again"
        return f"Expected a query result to {verb}, got none yet: run_sql first"

    def _submit_answer(self, args: dict[str, Any]) -> ToolResult:
        if args.get("from_last_result") is True and "answer" not in args:
            if self._last_result is None:
                raise BadArgs(self._no_result_message("submit"))
            # A result's rows stand for the answer: a row is read as its label or its value (answers.py).
            answer: Any = [list(row) for row in self._last_result[1]]
        elif "answer" in args:
            answer = args["answer"]
        else:
            raise BadArgs(f'Expected {{"answer": ...}} or {{"from_last_result": true}}, got keys {sorted(args)}')
        assert self.task is not None
        correct = answers_match(answer, self.task.gold)
        verdict = "correct" if correct else "incorrect"
        return ToolResult(f"Answer submitted: {verdict}.", done=True, success=correct)

    def _tool_remember(self, args: dict[str, Any]) -> ToolResult:
        result = super()._tool_remember(args)
        self._flags["notes"] += 1
        return result
