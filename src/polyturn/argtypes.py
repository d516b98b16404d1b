"""Argument types of the ``polyturn`` commands: a bad value ends in argparse's one-line error and exit status 2."""

from __future__ import annotations

import argparse
import json
from typing import Any


def json_object(text: str) -> dict[str, Any]:
    """``--env-kwargs`` and the like: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"Expected a JSON object, got {text!r} ({e.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"Expected a JSON object such as '{{\"max_turns\": 6}}', got {text!r}")
    return value


def _number(kind: type, *, low: float, high: float | None = None) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"Expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not (value >= low and (high is None or value <= high)):
            span = f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"Expected a value {span}, got {text}")
        return value

    return parse


non_negative_int = _number(int, low=0)
positive_int = _number(int, low=1)
non_negative_float = _number(float, low=0.0)
probability = _number(float, low=0.0, high=1.0)
port_number = _number(int, low=0, high=65535)
at_least_one = _number(float, low=1.0)
