"""transformers loading a GGUF model (the reference of the SmolLM2 tests) at ~40% of the cost.

transformers' GGUF load parses the file's metadata once for the config and again for the
weights, and builds gguf-py's tensor-name map once per module (~400 times for
SmolLM2): two thirds of its ~20 s here. Both are pure, so `gguf_parsed_once()` memoizes them
for the loads inside it; what comes out is bit for bit the same. (transformers imports both
names from `gguf` at call time; should that change, the loads are only slower.)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Inside: one gguf.GGUFReader per (path, mode) and one tensor-name map per model."""
    import gguf

    readers: dict[str, Any] = {}
    new_reader = gguf.GGUFReader

    def reader(path: Any, mode: str = "r") -> Any:
        key = f"{path}\0{mode}"
        if key not in readers:
            readers[key] = new_reader(path, mode)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield
