"""long_lived_frozen: what lives at the block's start is left out of the collector's walks until its end."""

from __future__ import annotations

import gc
import weakref

from polyturn.runtime import long_lived_frozen


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the garbage collector frees it


def test_objects_alive_at_the_start_are_frozen_and_garbage_made_inside_is_still_collected():
    before = Node()
    old_garbage = weakref.ref(Node())  # a cycle already garbage when the block starts: collected, not frozen
    assert gc.get_freeze_count() == 0
    with long_lived_frozen():
        assert old_garbage() is None
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert not any(o is before for o in gc.get_objects())  # frozen objects are not walked
        made = weakref.ref(Node())
        assert made() is not None
        gc.collect()
        assert made() is None  # a cycle made inside the block is collected as usual
        with long_lived_frozen():  # a nested block freezes more and leaves the outer freeze in place
            assert gc.get_freeze_count() >= frozen
        assert gc.get_freeze_count() >= frozen
    assert gc.get_freeze_count() == 0  # the outermost block's end unfreezes everything
    assert any(o is before for o in gc.get_objects())


def test_an_error_inside_the_block_still_unfreezes():
    try:
        with long_lived_frozen():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0
