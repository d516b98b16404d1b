"""Analysis tasks over the sales database, generated deterministically from a seed.

Levels of difficulty (``level`` option / env kwarg):

1. ``lookup``: one number, e.g. the revenue of a product in a zone in a quarter.
2. ``top_k``: the top-k products of a zone in a period by revenue or units.
3. ``trend``: the four quarterly values of a product in a zone in a year.
4. ``growth``: the percent change of a measure between two periods.
5. ``top_in_top``: a two-step question that needs an intermediate result
   (e.g. the top product of the zone with the highest revenue).

A fraction of level 2-4 tasks (``ambiguous_frac``, default 0.4) is vague on
purpose and needs a clarifying question: "sold best" / "sales" (by revenue or
by units?), "last quarter" (the last full quarter, or the current quarter to
the stated date?), "the north" (North China or Northeast?). The user's intent
is drawn 50/50 between the two readings, and a task is only kept when the two
readings give different answers, so guessing is right about half the time.

Prices change every quarter and some orders are discounted (see
:mod:`polyturn.envs.sql.database`), so revenue is not proportional to units; a
growth task is also only kept when answering it with the other measure (units
for revenue, revenue for units) would be judged wrong.

Every question starts with ``Today is YYYY-MM-DD.`` and names entities exactly
as they appear in the database, so they can be copied into SQL.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from polyturn.envs.sql.answers import (
    GoldAnswer,
    answers_match,
    format_gold,
    gold_from_result,
    has_top_level_order_by,
)
from polyturn.envs.sql.database import quarter_of
from polyturn.envs.sql.queries import (
    MEASURES,
    eq,
    measure_text,
    period_filters,
    period_text,
    sql_growth,
    sql_top,
    sql_top_in_top,
    sql_total,
    sql_trend,
)
from polyturn.envs.sql.sandbox import Sandbox

Slot = Literal["measure", "period", "zone"]
AnswerKind = Literal["number", "ranking", "trend", "name", "text", "list", "rows"]
LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
TEMPLATES = {1: "lookup", 2: "top_k", 3: "trend", 4: "growth", 5: "top_in_top"}
AMBIGUOUS_SLOTS: dict[str, tuple[Slot, ...]] = {
    "top_k": ("measure", "period", "zone"),
    "trend": ("measure", "zone"),
    "growth": ("measure", "zone"),
}
VAGUE_ZONES: dict[str, tuple[str, str]] = {
    "the north": ("North China", "Northeast"),
    "the south": ("South China", "Southwest"),
    "the west": ("Southwest", "Northwest"),
}
_TEMPLATE_KINDS: dict[str, AnswerKind] = {
    "lookup": "number", "top_k": "ranking", "trend": "trend", "growth": "number", "top_in_top": "name"
}
COMPLETE_REPLY = "My question is complete as stated."
_TASK_ID = re.compile(r"sql-L([1-5])-s(\d+)")


@dataclass(frozen=True)
class Ambiguity:
    """The vague part of a request: the slot, its readings, and a text that names each reading in a reply."""

    slot: Slot
    options: tuple[Any, ...]
    keys: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Task:
    """One request to the analyst, with everything needed to grade and to demonstrate it.

    ``params`` are the public parameters (the ambiguous slot is ``None``), so a
    scripted expert can use them without learning the hidden intent; the
    intent reaches a policy only through :meth:`answer_user`.
    """

    task_id: str
    level: int
    question: str
    gold_sql: str
    gold: GoldAnswer
    gold_tables: frozenset[str]
    key_actions: tuple[str, ...]
    template: str = "custom"
    params: Mapping[str, Any] = field(default_factory=dict)
    ambiguity: Ambiguity | None = None
    intent: str = ""
    reply: str = ""
    clarifications: tuple[tuple[str, str], ...] = ()  # task files: (trigger, reply)

    @property
    def answer_kind(self) -> AnswerKind:
        """What the answer is: a number, a ranking (ordered names), a trend (ordered numbers), a name,
        or for task files the gold shape (number, text, list or rows)."""
        if self.template in _TEMPLATE_KINDS:
            return _TEMPLATE_KINDS[self.template]
        if self.gold.kind == "scalar":
            return "number" if isinstance(self.gold.value, (int, float)) else "text"
        return self.gold.kind

    @property
    def ambiguous(self) -> bool:
        """Whether the request needs a clarifying question."""
        return bool(self.reply or self.clarifications)

    def answer_user(self, question: str) -> str:
        """What the simulated user says when asked ``question``."""
        if self.clarifications:
            asked = question.casefold()
            hits = [reply for trigger, reply in self.clarifications if trigger and trigger.casefold() in asked]
            return " ".join(hits or [reply for _, reply in self.clarifications])
        return self.reply or COMPLETE_REPLY

    def privileged(self) -> str:
        """Text the critic may read and the actor must never see: intent, gold SQL, gold answer."""
        intent = self.intent if self.ambiguous else "as stated"
        return f"Intent: {intent}\nGold SQL: {self.gold_sql}\nGold answer: {format_gold(self.gold)}"


@dataclass(frozen=True, kw_only=True)
class Catalog:
    """The entities of a sales database that tasks are drawn from."""

    zones: tuple[str, ...]
    products: tuple[str, ...]
    categories: tuple[str, ...]
    first_day: dt.date
    last_day: dt.date

    @classmethod
    def from_sandbox(cls, sandbox: Sandbox) -> Catalog:
        """Read zones, products, categories and the date range from a sales database."""

        def column_rows(sql: str) -> tuple[tuple[Any, ...], ...]:
            result = sandbox.run(sql, max_rows=1000, timed=False)
            if result.error:
                raise ValueError(f"Expected a polyturn sales database at {sandbox.path}, got {result.message} for "
                                 f"{sql!r}")
            return result.rows

        def column(sql: str) -> tuple[Any, ...]:
            return tuple(r[0] for r in column_rows(sql))

        (first, last), = column_rows("SELECT MIN(order_date), MAX(order_date) FROM orders")
        return cls(
            zones=column("SELECT zone FROM regions GROUP BY zone ORDER BY MIN(id)"),
            products=column("SELECT product FROM products ORDER BY id"),
            categories=column("SELECT category FROM products GROUP BY category ORDER BY MIN(id)"),
            first_day=dt.date.fromisoformat(first),
            last_day=dt.date.fromisoformat(last),
        )


def _q_index(label: str) -> int:
    """Quarters as consecutive integers: ``'2024-Q3'`` -> 2024 * 4 + 2."""
    year, q = label.split("-Q")
    return int(year) * 4 + int(q) - 1


def _q_of(day: dt.date) -> int:
    return _q_index(quarter_of(day))


def _q_label(index: int) -> str:
    return f"{index // 4}-Q{index % 4 + 1}"


def _q_start(index: int) -> dt.date:
    return dt.date(index // 4, 3 * (index % 4) + 1, 1)


class _Draft:
    """Mutable scratch state while one task is drawn."""

    def __init__(self, rng: random.Random, catalog: Catalog, today: dt.date) -> None:
        self.rng = rng
        self.catalog = catalog
        self.today = today
        self.current_q = _q_of(today)
        self.done_quarters = list(range(_q_of(catalog.first_day), self.current_q))  # completed before today
        self.done_years = list(range(catalog.first_day.year, today.year))

    def recent_quarter(self) -> int:
        """One of the last six quarters completed before today."""
        return self.rng.choice(self.done_quarters[-6:])

    def period(self) -> dict[str, Any]:
        """A completed period: a recent quarter (70%) or a whole year."""
        if self.rng.random() < 0.7 or not self.done_years:
            return {"quarter": _q_label(self.recent_quarter())}
        return {"year": self.rng.choice(self.done_years)}


def _question(template: str, p: Mapping[str, Any], vague: Mapping[str, str]) -> str:
    """The request text; ``vague`` maps an ambiguous slot to the vague phrase that replaces it."""
    zone = vague.get("zone") or p.get("zone")
    m = p.get("measure")
    when = "last quarter" if "period" in vague else f"in {period_text(p['period'])}" if "period" in p else ""
    if template == "lookup":
        if m == "revenue":
            return f"What was the total revenue of {p['product']} in {zone} {when}?"
        return f"How many units of {p['product']} were sold in {zone} {when}?"
    if template == "top_k":
        what = "had the highest revenue" if m == "revenue" else "sold the most units"
        what = "sold best" if "measure" in vague else what
        return f"Which {p['k']} products {what} in {zone} {when}?"
    if template == "trend":
        tail = "Give the four values in quarter order."
        if "measure" in vague:
            return f"How did sales of {p['product']} in {zone} develop over the quarters of {p['year']}? {tail}"
        if m == "revenue":
            return f"What was the quarterly revenue of {p['product']} in {zone} in {p['year']}? {tail}"
        return f"How many units of {p['product']} were sold in {zone} in each quarter of {p['year']}? {tail}"
    if template == "growth":
        kind = "sales" if "measure" in vague else "revenue" if m == "revenue" else "units sold"
        subject = f"{kind} of {p['product']}" if p.get("product") else f"total {kind}"
        span = f"from {period_text(p['before'])} to {period_text(p['after'])}"
        return f"By what percentage did {subject} in {zone} change {span}? Round to one decimal."
    mt = measure_text(m)
    return (
        f"In {period_text(p['period'])}, which {p['inner']} had the highest {mt} "
        f"in the {p['outer']} with the highest total {mt}?"
    )


def gold_sql(template: str, p: Mapping[str, Any]) -> str:
    """The gold query of a template for complete parameters."""
    m = p["measure"]
    if template == "lookup":
        filters = [eq("product", p["product"]), eq("zone", p["zone"]), *period_filters(p["period"])]
        return sql_total(measure=m, filters=filters)
    if template == "top_k":
        filters = [eq("zone", p["zone"]), *period_filters(p["period"])]
        return sql_top(label="product", measure=m, filters=filters, k=p["k"])
    if template == "trend":
        filters = [eq("product", p["product"]), eq("zone", p["zone"]), eq("year", p["year"])]
        return sql_trend(measure=m, filters=filters, labelled=False)
    if template == "growth":
        filters = ([eq("product", p["product"])] if p.get("product") else []) + [eq("zone", p["zone"])]
        return sql_growth(measure=m, filters=filters, before=p["before"], after=p["after"])
    return sql_top_in_top(outer=p["outer"], inner=p["inner"], measure=m, filters=period_filters(p["period"]))


def _params(template: str, d: _Draft) -> dict[str, Any]:
    rng, cat = d.rng, d.catalog
    p: dict[str, Any] = {"measure": rng.choice(MEASURES), "zone": rng.choice(cat.zones)}
    if template == "lookup":
        p |= {"product": rng.choice(cat.products), "period": d.period()}
    elif template == "top_k":
        p |= {"k": rng.choice((2, 3, 3, 5)), "period": d.period()}
    elif template == "trend":
        p |= {"product": rng.choice(cat.products), "year": rng.choice(d.done_years)}
    elif template == "growth":
        p["product"] = rng.choice(cat.products) if rng.random() < 0.7 else None
        after = d.recent_quarter()
        style = rng.choice(("prev_quarter", "prev_year", "year"))
        if style == "year" and len(d.done_years) >= 2:
            y = rng.choice(d.done_years[1:])
            p |= {"before": {"year": y - 1}, "after": {"year": y}}
        elif style == "prev_year" and after - 4 >= d.done_quarters[0]:
            p |= {"before": {"quarter": _q_label(after - 4)}, "after": {"quarter": _q_label(after)}}
        else:
            after = max(after, d.done_quarters[1])
            p |= {"before": {"quarter": _q_label(after - 1)}, "after": {"quarter": _q_label(after)}}
    else:
        outer, inner = rng.choice((("zone", "product"), ("zone", "region"), ("category", "product")))
        p = {"measure": p["measure"], "outer": outer, "inner": inner, "period": d.period()}
    return p


def _readings(slot: Slot, d: _Draft) -> tuple[tuple[Any, ...], tuple[str, ...], tuple[str, ...], str]:
    """(options, keys, replies, vague phrase) for an ambiguous slot."""
    if slot == "measure":
        return MEASURES, ("revenue", "units"), ("I mean by revenue.", "I mean by units sold."), "sales"
    if slot == "period":
        last, cur = _q_label(d.current_q - 1), _q_label(d.current_q)
        today = d.today.isoformat()
        options = ({"quarter": last}, {"quarter": cur, "until": today})
        replies = (f"I mean {last}, the last full quarter.", f"I mean the current quarter so far: {cur} up to {today}.")
        return options, (last, cur), replies, "last quarter"
    phrases = [ph for ph, zs in VAGUE_ZONES.items() if all(z in d.catalog.zones for z in zs)]
    phrase = d.rng.choice(phrases)
    zones = VAGUE_ZONES[phrase]
    return zones, zones, tuple(f"I mean {z}." for z in zones), phrase


def _answer(sandbox: Sandbox, sql: str) -> tuple[GoldAnswer, frozenset[str]] | None:
    result = sandbox.run(sql, max_rows=1000, timed=False)
    if result.error or not result.rows or any(v is None for row in result.rows for v in row):
        return None
    return gold_from_result(result.rows, ordered=has_top_level_order_by(sql)), result.tables


def _well_posed(template: str, p: Mapping[str, Any], sandbox: Sandbox) -> bool:
    """Reject draws whose answer is missing, tied, or too thin to be meaningful."""

    def distinct_top(label: str, filters: list[str], k: int) -> bool:
        rows = sandbox.run(sql_top(label=label, measure=p["measure"], filters=filters, k=k + 1), timed=False).rows
        totals = [r[1] for r in rows]
        return len(rows) >= k and len(set(totals)) == len(totals)

    if template == "top_k":
        return distinct_top("product", [eq("zone", p["zone"]), *period_filters(p["period"])], p["k"])
    if template == "trend":
        gold = _answer(sandbox, gold_sql(template, p))
        return gold is not None and gold[0].kind == "list" and len(gold[0].value) == 4
    if template == "top_in_top":
        filters = period_filters(p["period"])
        if not distinct_top(p["outer"], filters, 1):
            return False
        top = sandbox.run(sql_top(label=p["outer"], measure=p["measure"], filters=filters, k=1), timed=False).rows[0][0]
        return distinct_top(p["inner"], [*filters, eq(p["outer"], top)], 1)
    return True


def _measure_decides(template: str, p: Mapping[str, Any], gold: GoldAnswer, sandbox: Sandbox) -> bool:
    """Whether the same question asked of the other measure has an answer that does not match ``gold``."""
    other = MEASURES[1 - MEASURES.index(p["measure"])]
    alt = _answer(sandbox, gold_sql(template, {**p, "measure": other}))
    return alt is not None and not answers_match(alt[0].value, gold)


def generate_task(
    sandbox: Sandbox, catalog: Catalog, *, seed: int, level: int, ambiguous_frac: float = 0.4
) -> Task:
    """Draw the task of ``(seed, level)``; the same arguments always give the same task."""
    if level not in LEVELS:
        raise ValueError(f"Expected a level in {LEVELS}, got {level!r}")
    rng = random.Random(f"polyturn-sql-task-{seed}-{level}")
    template = TEMPLATES[level]
    # "Today" falls at least a year after the data starts, 20-80 days into a quarter, before the data ends.
    first_today_q, last_today_q = _q_of(catalog.first_day) + 4, _q_of(catalog.last_day)
    for _ in range(200):
        q = rng.randrange(first_today_q, last_today_q + 1)
        today = _q_start(q) + dt.timedelta(days=rng.randrange(20, 81))
        if today >= catalog.last_day:
            continue
        d = _Draft(rng, catalog, today)
        p = _params(template, d)
        slots = AMBIGUOUS_SLOTS.get(template, ())
        ambiguity = None
        vague: dict[str, str] = {}
        reply = intent = ""
        if slots and rng.random() < ambiguous_frac:
            slot = rng.choice(slots)
            options, keys, replies, phrase = _readings(slot, d)
            pick = rng.randrange(2)  # the hidden intent, 50/50
            ambiguity = Ambiguity(slot, tuple(options), tuple(keys))
            p[slot] = options[pick]  # each slot is also the name of its parameter
            vague = {slot: phrase}
            reply, intent = replies[pick], replies[pick].removeprefix("I mean ").rstrip(".")
        if not _well_posed(template, p, sandbox):
            continue
        sql = gold_sql(template, p)
        found = _answer(sandbox, sql)
        if found is None:
            continue
        gold, tables = found
        public = dict(p)
        if ambiguity is not None:
            # Keep only requests whose two readings disagree: then a guess is right half the time, not always.
            other = ambiguity.options[1 - ambiguity.options.index(p[ambiguity.slot])]
            alt = _answer(sandbox, gold_sql(template, {**p, ambiguity.slot: other}))
            if alt is None or answers_match(alt[0].value, gold):
                continue
            public[ambiguity.slot] = None
        if template == "growth" and not _measure_decides(template, p, gold, sandbox):
            continue
        key_actions = ["inspect_schema", *(["ask_user"] if ambiguity else []), "run_sql"]
        key_actions += ["run_sql"] if template == "top_in_top" else []
        return Task(
            task_id=f"sql-L{level}-s{seed}",
            level=level,
            question=f"Today is {today.isoformat()}. {_question(template, p, vague)}",
            gold_sql=sql,
            gold=gold,
            gold_tables=tables,
            key_actions=(*key_actions, "submit_answer"),
            template=template,
            params=public,
            ambiguity=ambiguity,
            intent=intent,
            reply=reply,
        )
    raise RuntimeError(f"Expected to draw a well-posed level-{level} task for seed {seed}, got none in 200 tries")


def parse_task_id(task_id: str) -> tuple[int, int] | None:
    """``(level, seed)`` of a generated task id such as ``sql-L3-s17``, or None for other ids."""
    m = _TASK_ID.fullmatch(task_id)
    return (int(m.group(1)), int(m.group(2))) if m else None
