"""Text spaces for language environments."""

from __future__ import annotations

import string
from typing import Any

import gymnasium

# What ``sample()`` draws from (check_env samples actions); ``contains`` accepts any character.
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n" + "华东北南销售额"


class TextSpace(gymnasium.spaces.Text):
    """Any Python ``str`` of ``min_length``..``max_length`` characters, Chinese text included.

    gymnasium's ``Text`` only contains strings over its sampling charset; a
    language model writes arbitrary Unicode, so membership here checks only
    the type and the length, while ``sample()`` still draws from a small
    charset for checkers and smoke tests.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a string of allowed length."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length})"
