"""The start-up heap frozen out of the cyclic collector's reach (:func:`cerebellar_norse.api.heap.freeze_startup_heap`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cerebellar_norse.api.heap import freeze_startup_heap


@pytest.fixture
def frozen() -> Iterator[int]:
    try:
        yield freeze_startup_heap()
    finally:
        gc.unfreeze()  # (this test process goes on making and dropping objects)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_a_collection_after_the_freeze_visits_only_objects_made_since(frozen: int) -> None:
    assert frozen > 10_000 and gc.get_freeze_count() > 10_000  # (pytest, the package and its libraries)
    assert len(gc.get_objects()) < frozen // 10  # what the collector still tracks, and a full collection visits


def test_garbage_made_after_the_freeze_is_still_collected(frozen: int) -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2
