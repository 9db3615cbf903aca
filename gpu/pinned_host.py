"""Page-locked memory that torch did not allocate: the grammar process's shared mask file.

A host->device copy from pageable memory is staged by the driver (a CPU copy, then the DMA);
from page-locked memory it is a DMA the stream runs by itself. The grammar actor's masks are
views of a shared file (actors/grammar_process.py), so registering that file with CUDA once
(cudaHostRegister) lets the executor upload a step's 5 MB of bits with no copy on the host
(gpu/token_bitmask.BitmaskUpload). `is_pinned` answers for any numpy array whether its bytes
lie inside a registered region.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog
import torch

log = structlog.get_logger("troupe.pinned_host")

_REGIONS: dict[int, int] = {}  # start address -> end address of each registered buffer
_EXPORTS: dict[int, ctypes.c_char] = {}  # ... and what keeps it exported (no resize, no close)


def pin_host_buffer(buffer: mmap.mmap) -> Callable[[], None]:
    """Register `buffer` with CUDA (page-locked, readable by DMA); returns the undo. Where
    registration fails, a warning and a no-op undo: uploads then copy as they would anyway."""
    holder = ctypes.c_char.from_buffer(buffer)
    start, size = ctypes.addressof(holder), len(buffer)
    error = _cudart().cudaHostRegister(start, size, 0)
    if int(error) != 0:
        log.warning("could not page-lock a host buffer; uploads copy it", error=str(error))
        return lambda: None
    _REGIONS[start], _EXPORTS[start] = start + size, holder

    def unpin() -> None:
        if _REGIONS.pop(start, None) is not None:
            _cudart().cudaHostUnregister(start)
            del _EXPORTS[start]

    return unpin


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def is_pinned(array: np.ndarray) -> bool:
    """Whether `array`'s bytes lie in one registered region."""
    if not _REGIONS:
        return False
    start = int(array.__array_interface__["data"][0])
    end = start + array.nbytes
    return any(lo <= start and end <= hi for lo, hi in _REGIONS.items())
