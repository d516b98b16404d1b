"""A scripted analyst for ``polyturn/SQLAnalyst-v0``, exact or with human-like mistakes.

The expert behaves as a careful analyst would, and as a language model could:

1. inspect the schema (``list_tables``, ``describe_table`` of ``sales``);
2. on an ambiguous request, ask the user and read the intent from the reply
   (it reads the task's public parameters, never the hidden intent);
3. query the ``sales`` view (two queries when an intermediate result is needed,
   reading that result from the observation text);
4. for trends, plot the result (optional: ``plot=False`` skips it);
5. submit the answer parsed from the observation text.

:class:`NoiseConfig` sets the probability, per episode, of each mistake; each
is a decision a learner can improve on with RL: skipping the schema, skipping
the clarifying question (then guessing, right about half the time), using the
wrong measure or the wrong period, a typo in the first query (fixed on the
next turn), and one malformed action (rewritten on the next turn).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping
from typing import Any, Literal

import gymnasium
from pydantic import Field

from polyturn.envs.actions import format_action
from polyturn.envs.noise import MistakeRates
from polyturn.envs.scripted import Script, ScriptedExpert
from polyturn.envs.sql.answers import gold_from_result, to_number
from polyturn.envs.sql.queries import MEASURES, eq, period_filters, sql_top, sql_trend
from polyturn.envs.sql.tasks import Task, gold_sql

_TYPOS = (("FROM sales", "FROM sale"), ("SUM(", "SUMM("), ("GROUP BY", "GRUOP BY"), ("SELECT", "SELCT"))
_ASK = {
    "measure": "Do you mean by revenue or by units sold?",
    "period": "Do you mean the last full quarter or the current quarter so far?",
}


class NoiseConfig(MistakeRates):
    """Per-episode probabilities of the expert's mistakes (all 0: the exact expert)."""

    skip_inspect: float = Field(0.0, ge=0, le=1, description="Skip list_tables and describe_table.")
    skip_clarification: float = Field(0.0, ge=0, le=1, description="Guess the intent instead of asking.")
    wrong_measure: float = Field(0.0, ge=0, le=1, description="Swap revenue and units in the query.")
    wrong_period: float = Field(0.0, ge=0, le=1, description="Query the period before the intended one.")
    sql_typo: float = Field(0.0, ge=0, le=1, description="A typo in the first query, fixed next turn.")
    format_error: float = Field(0.0, ge=0, le=1, description="One malformed action, rewritten next turn.")


def parse_table(obs: str) -> tuple[list[str], list[list[Any]]]:
    """Read a ``col1 | col2`` result observation back into columns and rows (numbers as numbers)."""
    lines = [line for line in obs.splitlines() if line and not line.startswith("(")]
    if not lines:
        return [], []

    def cell(text: str) -> Any:
        value = to_number(text) if re.fullmatch(r"-?\d+(\.\d+)?", text) else None
        if value is None:
            return None if text == "NULL" else text
        return int(value) if value.is_integer() and "." not in text else value

    return lines[0].split(" | "), [[cell(c) for c in line.split(" | ")] for line in lines[1:]]


def _say(thought: str, tool: str, args: Mapping[str, Any]) -> str:
    return format_action(tool, dict(args), thought)


class SQLExpert(ScriptedExpert):
    """Scripted analyst (a :class:`ScriptedExpert`: ``cls(env, noise=..., seed=...)``), reading the env's task.

    Args:
        env: the env (or a wrapper of it) whose current task the expert reads.
        noise: a :class:`NoiseConfig`, or one probability for every mistake.
        seed: seeds the mistakes; episodes are reproducible for a given seed and order.
        plot: draw a chart for trend questions.
        answer_style: ``"last_result"`` submits the final query's rows (``{"from_last_result": true}``);
            ``"copy"`` writes the values read from the observation into ``{"answer": ...}``.
    """

    NOISE = NoiseConfig
    RNG_NAME = "polyturn-expert"
    END_TOOL = "submit_answer"

    def __init__(
        self,
        env: gymnasium.Env,
        *,
        noise: float | NoiseConfig = 0.0,
        seed: int = 0,
        plot: bool = True,
        answer_style: Literal["last_result", "copy"] = "last_result",
    ) -> None:
        if answer_style not in ("last_result", "copy"):
            raise ValueError(f"Expected answer_style 'last_result' or 'copy', got {answer_style!r}")
        super().__init__(env, noise=noise, seed=seed)
        self.answer_style = answer_style
        self.plot = plot
        self._typo_pending = False

    def _plan(self, obs: str, info: Mapping[str, Any]) -> None:
        """The script for the env's current task; one malformed action at a random one of its first four
        steps, then whether the first query has a typo (other mistakes are drawn as the script runs)."""
        task: Task = self.env.task
        self._script = self._custom(task) if task.template == "custom" else self._analyst(task)
        self._broken_step = self.rng.randrange(4) if self._chance("format_error") else -1
        self._typo_pending = self._chance("sql_typo")  # in the first query only

    # ----- scripts --------------------------------------------------------------------------------
    def _inspect(self, table: str | None) -> Script:
        if not self._chance("skip_inspect"):
            yield _say("First see which tables exist.", "list_tables", {})
            if table is not None:
                yield _say(f"Check the columns of {table}.", "describe_table", {"table": table})

    def _query(self, sql: str, thought: str) -> Generator[str, str, str]:
        if self._typo_pending:
            self._typo_pending = False
            wrong, right = next((t for t in _TYPOS if t[0] in sql), ("", ""))
            yield _say(thought, "run_sql", {"sql": sql.replace(wrong, right, 1)})
            thought = "The query failed; fix the SQL."
        obs = yield _say(thought, "run_sql", {"sql": sql})
        return obs

    def _clarify(self, task: Task) -> Generator[str, str, Any]:
        amb = task.ambiguity
        assert amb is not None
        if self._chance("skip_clarification"):
            return amb.options[self.rng.randrange(len(amb.options))]
        question = _ASK.get(amb.slot) or f"Do you mean {amb.options[0]} or {amb.options[1]}?"
        reply = yield _say("The request is ambiguous; ask the user.", "ask_user", {"question": question})
        hits = [opt for opt, key in zip(amb.options, amb.keys) if key in reply]
        return hits[0] if len(hits) == 1 else amb.options[self.rng.randrange(len(amb.options))]

    def _mistakes(self, task: Task, p: dict[str, Any]) -> None:
        if "measure" in p and self._chance("wrong_measure"):
            p["measure"] = MEASURES[1 - MEASURES.index(p["measure"])]
        if self._chance("wrong_period"):
            first_year = self.env.catalog.first_day.year if self.env.catalog else 0
            key = "after" if task.template == "growth" else "period"
            if task.template == "trend":
                p["year"] = p["year"] - 1 if p["year"] - 1 >= first_year else p["year"] + 1
            else:
                p[key] = _previous_period(p[key], first_year)

    def _analyst(self, task: Task) -> Script:
        p = dict(task.params)
        yield from self._inspect("sales")
        if task.ambiguity is not None:
            slot = task.ambiguity.slot
            p[slot] = yield from self._clarify(task)
        self._mistakes(task, p)
        m, t = p["measure"], task.template
        if t == "top_in_top":
            filters = period_filters(p["period"])
            obs = yield from self._query(
                sql_top(label=p["outer"], measure=m, filters=filters, k=1), f"First find the top {p['outer']}."
            )
            rows = parse_table(obs)[1]
            top = rows[0][0] if rows else ""
            obs = yield from self._query(
                sql_top(label=p["inner"], measure=m, filters=[*filters, eq(p["outer"], top)], k=1),
                f"Now find the top {p['inner']} there.",
            )
            rows = parse_table(obs)[1]
            answer: Any = rows[0][0] if rows else ""
        elif t == "trend":
            filters = [eq("product", p["product"]), eq("zone", p["zone"]), eq("year", p["year"])]
            obs = yield from self._query(sql_trend(measure=m, filters=filters), "Get the quarterly totals.")
            rows = parse_table(obs)[1]
            answer = [r[-1] for r in rows]
            if self.plot and rows:
                title = f"{p['product']} {m} by quarter, {p['year']}"
                spec = {"kind": "line", "title": title, "from_last_result": True}
                yield _say("Plot the trend for the user.", "plot", spec)
        else:  # lookup, top_k, growth: one query, the same one the task's gold answer came from
            obs = yield from self._query(gold_sql(t, p), "Query the sales view.")
            rows = parse_table(obs)[1]
            answer = [r[0] for r in rows] if t == "top_k" else (rows[0][0] if rows else None)
        yield self._submit(answer)

    def _submit(self, answer: Any) -> str:
        if self.answer_style == "last_result":
            return _say("Submit the last result.", "submit_answer", {"from_last_result": True})
        return _say("Submit the answer from the result.", "submit_answer", {"answer": answer})

    def _custom(self, task: Task) -> Script:
        """Task-file tasks: inspect the gold query's first table, ask if needed, run the gold query."""
        yield from self._inspect(min(task.gold_tables) if task.gold_tables else None)
        if task.ambiguous and not self._chance("skip_clarification"):
            yield _say("The request is ambiguous; ask the user.", "ask_user", {"question": "What exactly do you mean?"})
        obs = yield from self._query(task.gold_sql, "Query the data.")
        rows = parse_table(obs)[1]
        gold = gold_from_result(rows, ordered=True) if rows else None
        answer = None if gold is None else gold.value
        yield self._submit(answer)


def _previous_period(period: Mapping[str, Any], first_year: int) -> dict[str, Any]:
    """The period just before ``period`` (a plausible mix-up), or just after at the start of the data."""
    if "year" in period:
        y = int(period["year"])
        return {"year": y - 1 if y - 1 >= first_year else y + 1}
    if period.get("until"):
        return {"quarter": period["quarter"]}  # the whole quarter instead of the quarter to date
    year, q = (int(v) for v in str(period["quarter"]).split("-Q"))
    index = year * 4 + q - 1 - 1
    if index // 4 < first_year:
        index += 2
    return {"quarter": f"{index // 4}-Q{index % 4 + 1}"}
