"""Gold answers from query results, and the rules that check a submitted answer.

The gold answer is whatever the task's gold SQL returns, reduced by shape:

* 1 row x 1 column -> a scalar (number or text);
* n rows x 1 column, or n rows x 2 columns of (text label, number) -> the list
  of the first column (a ranking, or the values of a trend);
* anything else -> the rows, as a list of lists.

A submission (the JSON value of ``submit_answer{"answer": ...}``) matches when:

* numbers agree within 1% relative or 0.05 absolute (so a value rounded to one
  decimal, or read from an observation that shows two decimals, still counts);
  numeric strings such as ``"1,234"`` or ``"12.5%"`` are read as numbers;
* texts agree ignoring case and repeated whitespace;
* lists have the same length and match element by element when the gold SQL
  has a top-level ``ORDER BY`` (rankings, trends), as multisets otherwise; a
  comma-separated string is read as a list; a submitted row such as
  ``["Fan", 1200]`` stands for its label when the gold element is text and for
  its last value when the gold element is a number;
* a scalar and a one-element list are interchangeable;
* rows match row by row (ordered or as a multiset, as for lists).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

REL_TOL = 0.01
ABS_TOL = 0.05
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class GoldAnswer:
    """The reference answer of a task: ``value`` has the shape named by ``kind``."""

    value: Any
    kind: Literal["scalar", "list", "rows"]
    ordered: bool


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def gold_from_result(rows: Sequence[Sequence[Any]], *, ordered: bool) -> GoldAnswer:
    """Reduce a gold query's rows to the answer shape described in the module docstring."""
    rows = [list(r) for r in rows]
    width = len(rows[0]) if rows else 1
    if len(rows) == 1 and width == 1:
        return GoldAnswer(rows[0][0], "scalar", ordered)
    label_measure = width == 2 and all(isinstance(r[0], str) and (_is_number(r[1]) or r[1] is None) for r in rows)
    if width == 1 or label_measure:
        return GoldAnswer([r[0] for r in rows], "list", ordered)
    return GoldAnswer(rows, "rows", ordered)


def has_top_level_order_by(sql: str) -> bool:
    """Whether ``sql`` sorts its final result (an ``ORDER BY`` outside parentheses and string literals)."""
    depth = 0
    cleaned = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"":
            end = sql.find(ch, i + 1)
            i = n if end < 0 else end + 1
            cleaned.append(" ")
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        cleaned.append(ch if depth == 0 and ch not in "()" else " ")
        i += 1
    return re.search(r"\border\s+by\b", "".join(cleaned), re.IGNORECASE) is not None


def to_number(x: Any) -> float | None:
    """``x`` as a float when it is a number or a numeric string (``"1,234"``, ``"12.5%"``), else None."""
    if _is_number(x):
        return float(x)
    if isinstance(x, str):
        text = x.strip().replace(",", "").rstrip("%").strip()
        if _NUMBER.fullmatch(text):
            value = float(text)
            return value if math.isfinite(value) else None
    return None


def _norm_text(x: Any) -> str:
    return " ".join(str(x).split()).casefold()


def scalars_match(submitted: Any, gold: Any) -> bool:
    """Compare two single values by the number or text rules."""
    if gold is None or submitted is None:
        return gold is None and (submitted is None or _norm_text(submitted) in {"null", "none"})
    g, s = to_number(gold), to_number(submitted)
    if _is_number(gold) and s is not None and g is not None:
        return abs(s - g) <= max(REL_TOL * abs(g), ABS_TOL)
    if isinstance(submitted, (list, dict)):
        return False
    return _norm_text(submitted) == _norm_text(gold)


def _element_match(submitted: Any, gold: Any) -> bool:
    if isinstance(submitted, (list, tuple)) and not isinstance(gold, (list, tuple)):
        if not submitted:
            return False
        submitted = submitted[-1] if _is_number(gold) else submitted[0]
    return scalars_match(submitted, gold)


def _rows_match(submitted: Any, gold: Sequence[Any]) -> bool:
    if not isinstance(submitted, (list, tuple)) or len(submitted) != len(gold):
        return False
    return all(scalars_match(s, g) for s, g in zip(submitted, gold))


def _sequence_match(submitted: Sequence[Any], gold: Sequence[Any], *, ordered: bool, match: Any) -> bool:
    if len(submitted) != len(gold):
        return False
    if ordered:
        return all(match(s, g) for s, g in zip(submitted, gold))
    unused = list(submitted)
    for g in gold:
        hit = next((k for k, s in enumerate(unused) if match(s, g)), None)
        if hit is None:
            return False
        unused.pop(hit)
    return True


def _as_list(submitted: Any) -> list[Any]:
    if isinstance(submitted, (list, tuple)):
        return list(submitted)
    if isinstance(submitted, str) and "," in submitted and to_number(submitted) is None:
        return [part.strip() for part in submitted.split(",")]
    return [submitted]


def answers_match(submitted: Any, gold: GoldAnswer) -> bool:
    """Whether a submitted answer matches the gold answer (rules in the module docstring)."""
    if gold.kind == "scalar":
        if isinstance(submitted, (list, tuple)) and len(submitted) == 1:
            submitted = submitted[0]
        return _element_match(submitted, gold.value)
    if gold.kind == "list":
        return _sequence_match(_as_list(submitted), gold.value, ordered=gold.ordered, match=_element_match)
    if not isinstance(submitted, (list, tuple)):
        return False
    return _sequence_match(list(submitted), gold.value, ordered=gold.ordered, match=_rows_match)


def format_gold(gold: GoldAnswer) -> str:
    """The gold value as compact text, for the critic's privileged view."""
    value = gold.value
    if gold.kind == "scalar":
        return str(value)
    if gold.kind == "list":
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "; ".join(" | ".join(str(v) for v in row) for row in value)
