"""SQL builders for the ``sales`` view, shared by the task generator and the expert.

Every query follows one regular shape, because a tiny language model learns
to write them from demonstrations::

    SELECT <label>, SUM(<measure>) AS total FROM sales WHERE <filters>
    GROUP BY <label> ORDER BY total DESC LIMIT <k>

Periods are small dicts: ``{"quarter": "2024-Q3"}``, ``{"year": 2023}`` or
``{"quarter": "2024-Q4", "until": "2024-11-20"}`` (the quarter to date).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Measure = Literal["revenue", "units"]
MEASURES: tuple[Measure, ...] = ("revenue", "units")


def lit(value: Any) -> str:
    """A SQL literal: integers as they are, text single-quoted with quotes doubled."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def eq(column: str, value: Any) -> str:
    """The filter ``column = value``."""
    return f"{column} = {lit(value)}"


def period_filters(period: Mapping[str, Any]) -> list[str]:
    """The WHERE conditions that select a period."""
    if "year" in period:
        return [eq("year", int(period["year"]))]
    conds = [eq("quarter", period["quarter"])]
    if period.get("until"):
        conds.append(f"order_date <= {lit(period['until'])}")
    return conds


def period_text(period: Mapping[str, Any]) -> str:
    """How a question or reply names a period: ``2024-Q3``, ``2023``, ``2024-Q4 up to 2024-11-20``."""
    if "year" in period:
        return str(period["year"])
    if period.get("until"):
        return f"{period['quarter']} up to {period['until']}"
    return str(period["quarter"])


def measure_text(measure: Measure) -> str:
    """How a question names a measure."""
    return "revenue" if measure == "revenue" else "units sold"


def _where(conds: list[str]) -> str:
    return " WHERE " + " AND ".join(conds) if conds else ""


def sql_total(*, measure: Measure, filters: list[str]) -> str:
    """One number: the sum of ``measure`` over the filtered rows."""
    return f"SELECT SUM({measure}) AS total FROM sales{_where(filters)}"


def sql_top(*, label: str, measure: Measure, filters: list[str], k: int) -> str:
    """The ``k`` values of ``label`` with the largest total ``measure``, largest first, with their totals."""
    return (
        f"SELECT {label}, SUM({measure}) AS total FROM sales{_where(filters)} "
        f"GROUP BY {label} ORDER BY total DESC LIMIT {k}"
    )


def sql_trend(*, measure: Measure, filters: list[str], labelled: bool = True) -> str:
    """Quarterly totals in quarter order (``labelled`` adds the quarter column for reading and plotting)."""
    label = "quarter, " if labelled else ""
    return f"SELECT {label}SUM({measure}) AS total FROM sales{_where(filters)} GROUP BY quarter ORDER BY quarter"


def sql_growth(*, measure: Measure, filters: list[str], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """Percent change of the total ``measure`` from period ``before`` to ``after``, rounded to one decimal."""

    def part(period: Mapping[str, Any]) -> str:
        return f"SUM(CASE WHEN {' AND '.join(period_filters(period))} THEN {measure} END)"

    a, b = part(before), part(after)
    return f"SELECT ROUND(100.0 * ({b} - {a}) / {a}, 1) AS growth FROM sales{_where(filters)}"


def sql_top_in_top(*, outer: str, inner: str, measure: Measure, filters: list[str]) -> str:
    """One statement for a two-step question: the top ``inner`` within the top ``outer``."""
    sub = f"SELECT {outer} FROM sales{_where(filters)} GROUP BY {outer} ORDER BY SUM({measure}) DESC LIMIT 1"
    return sql_top(label=inner, measure=measure, filters=[*filters, f"{outer} = ({sub})"], k=1)
