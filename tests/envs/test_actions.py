"""parse_action / format_action: the examples, the tolerances, the errors, and properties."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyturn.envs.actions import FormatError, ToolCall, format_action, parse_action


def test_thought_and_action() -> None:
    text = 'Thought: I need the columns.\nAction: describe_table[{"table": "sales"}]'
    call = parse_action(text)
    assert call == ToolCall("describe_table", {"table": "sales"}, "I need the columns.", text)


@pytest.mark.parametrize(
    "text",
    [
        "Action: list_tables[{}]",
        "  \n action: list_tables[]  \n",
        "ACTION :list_tables [ ]",
        "Action: list_tables[{}]\nObservation: Tables: a, b",
    ],
)
def test_tolerant_forms_mean_no_args(text: str) -> None:
    call = parse_action(text)
    assert isinstance(call, ToolCall)
    assert (call.tool, call.args, call.thought) == ("list_tables", {}, None)


def test_thought_without_prefix_and_several_lines() -> None:
    call = parse_action("thought: first\nThought:  second   part\r\nAction: ask_user[{\"question\": \"which?\"}]")
    assert isinstance(call, ToolCall)
    assert call.thought == "first second part"
    assert call.args == {"question": "which?"}
    call = parse_action("I will look.\nAction: list_tables[{}]")
    assert isinstance(call, ToolCall) and call.thought == "I will look."


def test_json_with_brackets_and_newlines_inside() -> None:
    text = 'Action: plot[{\n  "kind": "bar",\n  "x": ["a]", "b"],\n  "y": [1, 2]\n}]'
    call = parse_action(text)
    assert isinstance(call, ToolCall)
    assert call.args == {"kind": "bar", "x": ["a]", "b"], "y": [1, 2]}


def test_chinese_text_kept() -> None:
    call = parse_action('Thought: 查询华东\nAction: run_sql[{"sql": "SELECT 1 -- 华东"}]')
    assert isinstance(call, ToolCall)
    assert call.thought == "查询华东" and call.args["sql"].endswith("华东")


def test_word_action_inside_a_thought_is_not_an_action_line() -> None:
    call = parse_action("Thought: the next action: list tables\nAction: list_tables[{}]")
    assert isinstance(call, ToolCall) and call.tool == "list_tables"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("", "empty"),
        ("   \n ", "empty"),
        ("Thought: hmm", "no_action"),
        ("I think list_tables[{}]", "no_action"),
        ("Action: list_tables[{}]\nAction: run_sql[{\"sql\": \"x\"}]", "multiple_actions"),
        ("Action: list_tables", "bad_syntax"),
        ("Action: [{}]", "bad_syntax"),
        ("Action: run_sql[{\"sql\": \"x\"}", "bad_syntax"),
        ("Action: run_sql[{\"sql\": \"x\"} trailing]", "bad_syntax"),
        ("Action: run_sql[{sql: x}]", "bad_json"),
        ("Action: run_sql[\"SELECT 1\"]", "args_not_object"),
        ("Action: run_sql[[1, 2]]", "args_not_object"),
        ("Action: run_sql[" + "[" * 100_000 + "]", "bad_json"),
        ("Action: run_sql[{\"sql\": \"SELECT '\\ud800'\"}]", "bad_json"),  # a lone surrogate, JSON-escaped
        ("Action: reply[{\"text\": {\"a\": [\"x\\udfff\"]}}]", "bad_json"),  # nested
    ],
)
def test_errors(text: str, kind: str) -> None:
    result = parse_action(text)
    assert isinstance(result, FormatError), result
    assert result.kind == kind
    assert result.raw == text
    assert result.message


def test_format_action_canonical() -> None:
    text = format_action("run_sql", {"sql": "SELECT 1", "n": [1, 2]}, "Query  it\nnow.")
    assert text == 'Thought: Query it now.\nAction: run_sql[{"sql": "SELECT 1", "n": [1, 2]}]'
    assert format_action("list_tables") == "Action: list_tables[{}]"
    assert format_action("ask_user", {"question": "华东?"}) == 'Action: ask_user[{"question": "华东?"}]'
    with pytest.raises(ValueError, match="Expected a tool name"):
        format_action("bad name", {})


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_never_raises_on_any_text(text: str) -> None:
    result = parse_action(text)
    assert isinstance(result, (ToolCall, FormatError))
    assert result.raw == text


_PIECES = ["Action:", "action :", "Thought:", "[", "]", "{", "}", '"', "\n", "\r", " ", "run_sql", "{}", "[]", ":", ","]
_ACTIONISH = st.lists(st.sampled_from(_PIECES), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_ACTIONISH, st.tuples(_ACTIONISH, st.text(max_size=20)).map("".join)))
def test_parse_never_raises_on_action_like_text(text: str) -> None:
    assert isinstance(parse_action(text), (ToolCall, FormatError))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    tool=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
    args=st.dictionaries(st.text(), _json, max_size=4),
    thought=st.none() | st.text(),
)
def test_round_trip(tool: str, args: dict, thought: str | None) -> None:
    text = format_action(tool, args, thought)
    call = parse_action(text)
    assert isinstance(call, ToolCall), (text, call)
    assert call.tool == tool
    assert json.dumps(call.args, sort_keys=True) == json.dumps(args, sort_keys=True)
    assert call.args == args
    assert call.thought == (" ".join((thought or "").split()) or None)
    assert call.raw == text
