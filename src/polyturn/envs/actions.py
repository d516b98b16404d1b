"""ReAct action text <-> tool calls.

An action is plain text: optional thought lines, then exactly one action line::

    Thought: I need the columns of the sales view.
    Action: describe_table[{"table": "sales"}]

Parsing rules (:func:`parse_action` never raises):

* Surrounding whitespace is ignored. ``Action:`` is case-insensitive and must
  start a line (after optional spaces), so the word "action:" inside a
  thought does not count.
* Everything before the action line is the thought; a leading ``Thought:`` on
  each line is dropped and whitespace is collapsed to single spaces. No
  thought gives ``thought=None``.
* The action line is ``tool_name[<json object>]``: the tool name is an
  identifier (letters, digits, underscore), then ``[``, a JSON object, ``]``.
  ``[]`` and ``[{}]`` both mean no arguments. The JSON may span lines.
* Text after the closing bracket is ignored (models often go on to imagine
  the observation), unless it holds another ``Action:`` line, which is the
  ``multiple_actions`` error.

Errors (``FormatError.kind``): ``empty``, ``no_action``, ``multiple_actions``,
``bad_syntax`` (no tool name or brackets), ``bad_json`` (invalid JSON, or a lone surrogate in it),
``args_not_object``.

:func:`format_action` is the canonical writer: one ``Thought:`` line (if any)
and compact JSON args (``ensure_ascii=False``, separators ``", "`` and ``": "``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

FormatErrorKind = Literal["empty", "no_action", "multiple_actions", "bad_syntax", "bad_json", "args_not_object"]

_ACTION_LINE = re.compile(r"(?im)^[ \t]*action[ \t]*:[ \t]*")
_TOOL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*\[")
_THOUGHT_PREFIX = re.compile(r"(?i)^\s*thought\s*:")
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    """A parsed action: the tool, its JSON args, the thought before it, and the raw text."""

    tool: str
    args: dict[str, Any]
    thought: str | None
    raw: str


@dataclass(frozen=True)
class FormatError:
    """Why an action text could not be parsed."""

    kind: FormatErrorKind
    message: str
    raw: str


def _thought(text: str) -> str | None:
    lines = [_THOUGHT_PREFIX.sub("", line, count=1) for line in text.splitlines()]
    joined = " ".join(" ".join(lines).split())
    return joined or None


def parse_action(text: str) -> ToolCall | FormatError:
    """Parse ReAct text into a :class:`ToolCall`, or say why not with a :class:`FormatError`."""
    if not isinstance(text, str):
        return FormatError("empty", f"Expected action text as str, got {type(text).__name__}", str(text))
    if not text.strip():
        return FormatError("empty", "Expected an action, got empty text", text)
    raw = text
    # A lone carriage return also ends a line; same length, so positions still index `raw`.
    text = text.replace("\r", "\n")
    match = _ACTION_LINE.search(text)
    if match is None:
        return FormatError("no_action", "Expected a line `Action: tool_name[{json args}]`, got none", raw)
    tool = _TOOL.match(text, match.end())
    if tool is None:
        line = text[match.end() :].split("\n", 1)[0][:60]
        return FormatError("bad_syntax", f"Expected `tool_name[{{json args}}]` after Action:, got {line!r}", raw)
    pos = tool.end()
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if text.startswith("]", pos):
        args: Any = {}
        end = pos + 1
    else:
        try:
            args, stop = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            # RecursionError: pathologically nested brackets; still a JSON problem, not a crash.
            return FormatError("bad_json", f"Expected JSON args inside [...], got invalid JSON ({exc})"[:300], raw)
        while stop < len(text) and text[stop].isspace():
            stop += 1
        if not text.startswith("]", stop):
            return FormatError("bad_syntax", "Expected `]` right after the JSON args", raw)
        end = stop + 1
        if not isinstance(args, dict):
            return FormatError("args_not_object", f"Expected a JSON object as args, got {type(args).__name__}", raw)
        try:  # JSON may escape a lone surrogate ("\ud800"): no database, file or tokenizer can take it
            json.dumps(args, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return FormatError("bad_json", "Expected valid Unicode in the JSON args, got a lone surrogate", raw)
    if _ACTION_LINE.search(text, end) is not None:
        return FormatError("multiple_actions", "Expected exactly one Action line, got more", raw)
    return ToolCall(tool=tool.group(1), args=args, thought=_thought(text[: match.start()]), raw=raw)


def format_action(tool: str, args: dict[str, Any] | None = None, thought: str | None = None) -> str:
    """Write a tool call as canonical action text (the inverse of :func:`parse_action`).

    The thought is written on one line (whitespace collapsed), so
    ``parse_action(format_action(t, a, th))`` gives back ``t``, ``a`` and the
    collapsed thought.
    """
    if not TOOL_NAME.fullmatch(tool):
        raise ValueError(f"Expected a tool name of letters, digits and underscores, got {tool!r}")
    payload = json.dumps(args or {}, ensure_ascii=False, separators=(", ", ": "))
    line = f"Action: {tool}[{payload}]"
    text = " ".join((thought or "").split())
    return f"Thought: {text}\n{line}" if text else line
