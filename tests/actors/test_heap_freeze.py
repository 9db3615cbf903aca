"""The engine freezes the start-up heap while it runs and unfreezes it when the last closes."""

from __future__ import annotations

import gc

import pytest
from troupe import Engine, EngineConfig, SamplingParams
from troupe.actors.heap_freeze import frozen_heap


@pytest.fixture(autouse=True)
def unfrozen_heap() -> None:
    if gc.get_freeze_count():  # an engine another test left open: nothing to assert here
        pytest.skip("the heap is frozen already")


def _walked(objects: list[list[int]]) -> bool:
    """Whether the collector still walks any of `objects` (frozen ones it does not)."""
    ids = {id(o) for o in objects}
    return any(id(o) in ids for o in gc.get_objects())


def test_nested_holders_unfreeze_when_the_last_leaves() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap(True):
        frozen = gc.get_freeze_count()
        assert frozen > 0
        made = [[] for _ in range(10)]  # lists: tracked by the collector
        assert _walked(made)
        with frozen_heap(True):  # a second engine freezes its own start-up too
            assert not _walked(made)
        assert gc.get_freeze_count() > 0  # the outer holder is still open
        with frozen_heap(False):
            pass
        del made
    assert gc.get_freeze_count() == 0


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_a_freeze_found_before_does_not_keep_a_closed_engines_cycles() -> None:
    """Something froze objects before the first engine came (the device machines' image
    does): once the last engine closes, what it froze is collectable again, so its reference
    cycles (a closed engine's actors and runner) do not live for the life of the process."""
    import weakref

    gc.freeze()
    try:
        engine_part = _Node()
        with frozen_heap(True):
            gone = weakref.ref(engine_part)
            del engine_part
        gc.collect()
        assert gone() is None
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


@pytest.mark.anyio
async def test_engine_freezes_its_start_up_heap_while_open() -> None:
    assert gc.get_freeze_count() == 0
    async with Engine.open(EngineConfig(runner="fake", num_kv_blocks=64)) as engine:
        assert gc.get_freeze_count() > 1000  # the engine's start-up objects
        async for _ in engine.generate([1, 2, 3], SamplingParams(max_tokens=4)):
            pass
    assert gc.get_freeze_count() == 0
    async with Engine.open(EngineConfig(runner="fake", num_kv_blocks=64, gc_freeze=False)):
        assert gc.get_freeze_count() == 0
