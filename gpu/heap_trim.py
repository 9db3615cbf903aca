"""Give freed heap back to the OS on the CPU: after a model load, and for every large block.

Loading a GGUF on the CPU allocates and frees a few hundred MiB of temporaries (fp32 row slices
of the re-quantised lm_head, the packing passes of the 4-bit weights). glibc keeps freed heap
below its trim threshold and in per-thread arenas, so the process's RSS stays ~100 MiB above
what it holds; malloc_trim(0) returns those pages. Elsewhere (not glibc) it does nothing.

While serving, glibc's mmap threshold is dynamic: once a block above it is freed, blocks up to
that size come from the heap, and a long prefill's activations (MiBs each) then stay in the
worker thread's arena after the step, on top of the KV pages. `map_large_blocks` fixes the
threshold (mallopt M_MMAP_THRESHOLD; that also turns the dynamic rise off), so such blocks are
mapped and unmapped per use: the engine's peak RSS follows what is live. The price is a page
fault per 4 KiB of each large block per use; the decode step's blocks (one row) stay below it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name)


def release_freed_heap() -> bool:
    """malloc_trim(0) where libc has it (glibc); whether it ran."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE_BLOCK_BYTES = 1 << 20  # a decode row's tensors are far below; prefill activations above


def map_large_blocks(threshold: int = LARGE_BLOCK_BYTES) -> bool:
    """mallopt(M_MMAP_THRESHOLD, threshold) where libc has it (glibc); whether it took."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
