"""Test-case files: formats, validation messages, and make_test_cases on the SQL env."""

from __future__ import annotations

import json

import pytest

from polyturn.eval.testcases import load_test_cases, make_test_cases, parse_seed_range


def test_make_test_cases_records_expected_key_actions(tmp_path):
    out = tmp_path / "cases.jsonl"
    cases = make_test_cases("polyturn/SQLAnalyst-v0", "10:14", out)
    assert [c["seed"] for c in cases] == [10, 11, 12, 13]
    loaded = load_test_cases(out)
    assert [c.seed for c in loaded] == [10, 11, 12, 13] and len({c.id for c in loaded}) == 4
    for raw, case in zip(cases, loaded):
        keys = case.expected_key_actions
        assert keys and keys[0] == "inspect_schema" and keys[-1] == "submit_answer"
        assert ("ask_user" in keys) == raw["ambiguous"]
        assert raw["task_id"] in case.id


def test_json_list_object_and_jsonl_are_accepted(tmp_path):
    case = {"env": "polyturn/SQLAnalyst-v0", "seed": 3}
    (tmp_path / "a.json").write_text(json.dumps([case, dict(case, seed=4)]))
    (tmp_path / "b.json").write_text(json.dumps({"cases": [case]}))
    (tmp_path / "c.jsonl").write_text(json.dumps(case) + "\n\n" + json.dumps(dict(case, options={"task_id": "sql-L2-s9"})))
    assert [c.id for c in load_test_cases(tmp_path / "a.json")] == ["0", "1"]
    assert load_test_cases(tmp_path / "b.json")[0].task() == {"seed": 3, "options": {}}
    assert load_test_cases(tmp_path / "c.jsonl")[1].options == {"task_id": "sql-L2-s9"}


@pytest.mark.parametrize("content, message", [
    ('[{"seed": 1}]', 'Expected "env"'),
    ('[{"env": "polyturn/SQLAnalyst-v0"}]', 'Expected a "seed" or explicit "options"'),
    ('[{"env": "polyturn/SQLAnalyst-v0", "seed": "x"}]', "Expected an integer seed"),
    ('[{"env": "polyturn/SQLAnalyst-v0", "seed": 1, "colour": 2}]', "unknown"),
    ('[{"id": "a", "env": "e", "seed": 1}, {"id": "a", "env": "e", "seed": 2}]', "unique case ids"),
    ("[]", "non-empty list"),
    ("{not json\n", "invalid JSON"),
])
def test_validation_errors_say_what_was_expected(tmp_path, content, message):
    path = tmp_path / "cases.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_test_cases(path)


def test_missing_file_and_bad_ranges(tmp_path):
    with pytest.raises(FileNotFoundError, match="make-test-cases"):
        load_test_cases(tmp_path / "none.json")
    assert list(parse_seed_range("5")) == [5]
    for bad in ("5:5", "a:b", "-1:3"):
        with pytest.raises(ValueError, match="A:B"):
            parse_seed_range(bad)
    with pytest.raises(ValueError, match="registered env id"):
        make_test_cases("polyturn/Nope-v0", "0:2", tmp_path / "x.jsonl")
