"""Gold answers by result shape, and the matching rules for submissions."""

from __future__ import annotations

import pytest

from polyturn.envs.sql.answers import GoldAnswer, answers_match, gold_from_result, has_top_level_order_by, to_number


def test_gold_shapes() -> None:
    assert gold_from_result([(42,)], ordered=False) == GoldAnswer(42, "scalar", False)
    assert gold_from_result([("Fan",), ("Lamp",)], ordered=True) == GoldAnswer(["Fan", "Lamp"], "list", True)
    assert gold_from_result([("Fan", 10), ("Lamp", 3)], ordered=True).value == ["Fan", "Lamp"]  # label + measure
    assert gold_from_result([(10,), (12,)], ordered=True).value == [10, 12]
    rows = [["a", "b"], ["c", "d"]]
    assert gold_from_result([("a", "b"), ("c", "d")], ordered=False) == GoldAnswer(rows, "rows", False)
    assert gold_from_result([("Fan", 1, 2)], ordered=False).kind == "rows"
    assert gold_from_result([], ordered=False) == GoldAnswer([], "list", False)


def test_order_by_detection() -> None:
    assert has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert has_top_level_order_by("select a from t order  by 1 desc limit 3")
    assert not has_top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a)")
    assert not has_top_level_order_by("SELECT 'ORDER BY' FROM t")
    assert not has_top_level_order_by("SELECT a, ROW_NUMBER() OVER (ORDER BY b) FROM t")


@pytest.mark.parametrize(
    ("submitted", "gold", "ok"),
    [
        (100, 100, True),
        (100.9, 100, True),  # within 1%
        (102, 100, False),
        ("1,234", 1234, True),
        ("12.5%", 12.5, True),
        (12.54, 12.5, True),  # abs 0.05 for values rounded to one decimal
        (12.7, 12.5, False),
        ([100], 100, True),
        (True, 1, False),
        ("laptop", "Laptop", True),
        ("  Yoga   Mat ", "Yoga Mat", True),
        ("Yoga", "Yoga Mat", False),
        (None, 3, False),
        ({"a": 1}, "a", False),
    ],
)
def test_scalar_rules(submitted, gold, ok) -> None:
    assert answers_match(submitted, GoldAnswer(gold, "scalar", False)) is ok


def test_list_rules() -> None:
    ranking = GoldAnswer(["Fan", "Lamp", "Kettle"], "list", True)
    assert answers_match(["fan", "LAMP", "Kettle"], ranking)
    assert not answers_match(["Lamp", "Fan", "Kettle"], ranking)  # order matters with ORDER BY
    assert not answers_match(["Fan", "Lamp"], ranking)
    assert answers_match("Fan, Lamp, Kettle", ranking)
    assert answers_match([["Fan", 10], ["Lamp", 5], ["Kettle", 1]], ranking)
    unordered = GoldAnswer(["Fan", "Lamp", "Kettle"], "list", False)
    assert answers_match(["Kettle", "Fan", "Lamp"], unordered)
    assert not answers_match(["Kettle", "Fan", "Fan"], unordered)
    trend = GoldAnswer([100, 200, 300, 400], "list", True)
    assert answers_match([100.4, 200, 300, 400], trend)
    assert not answers_match([100, 200, 400, 300], trend)
    assert answers_match([["2023-Q1", 100], ["2023-Q2", 200], ["2023-Q3", 300], ["2023-Q4", 400]], trend)
    single = GoldAnswer(["Fan"], "list", True)
    assert answers_match("Fan", single) and answers_match(["Fan"], single)
    assert not answers_match("Lamp", single)


def test_rows_rules() -> None:
    gold = GoldAnswer([["a", 1], ["b", 2]], "rows", False)
    assert answers_match([["b", 2], ["A", 1.0]], gold)
    assert not answers_match([["a", 1]], gold)
    assert not answers_match("a", gold)
    assert not answers_match([["a", 1], ["b", 3]], gold)


def test_to_number() -> None:
    assert to_number("1,234.5") == 1234.5
    assert to_number("-3%") == -3.0
    assert to_number("abc") is None and to_number(False) is None and to_number("nan") is None
