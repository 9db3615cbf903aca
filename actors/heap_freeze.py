"""The start-up heap kept out of the cyclic garbage collector's sight while engines run
(EngineConfig.gc_freeze).

A started engine holds ~190,000 objects that the collector tracks (modules, parameters,
captured graphs, tokenizer tables, actor state), and they live as long as the engine. A full
collection walks all of them: ~100 ms on this project's CPU machine and on the H200's host
(docs/benchmarks.md, session 12), a pause of every running request's next token; one fell
inside most 1.5 s windows of steady serving on the H200 host. `gc.freeze()` moves what exists
once the engine is ready into a generation the collector never walks: a full collection then
costs ~0 ms, growing only with what is allocated after.

The first engine to open freezes (after collecting the young generations; older garbage stays
until the unfreeze); each later one freezes its own start-up too; when the last closes the heap
is unfrozen, also when something else had frozen objects before the first engine came (the
device machines' image freezes ~375 at start-up): Python cannot unfreeze a part, and leaving
the freeze would keep the closed engines' objects, which reference cycles hold (actors and
runner refer to each other), out of the collector's reach for the life of the process, with
whatever device memory they hold (a second engine in one process found the first's 71.5 GiB
in use on an H100). What the other party froze is then walked again: a cost in pause time only.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0


@contextmanager
def frozen_heap(enabled: bool) -> Iterator[None]:
    """Collect, then freeze the heap as it is; unfreeze when the last holder leaves."""
    global _holders
    if not enabled:
        yield
        return
    with _lock:
        _holders += 1
        gc.collect(1)  # the young garbage: cheap (a full collection is what this avoids)
        gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.unfreeze()
