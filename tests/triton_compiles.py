"""Counting Triton's compiles: a test that a warmed-up path launches no new kernel variant."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def triton_compiles() -> Iterator[list[str]]:
    """The kernels Triton compiles inside the block (their signatures), through its
    post-compile hook; the hook that was set before is restored after."""
    import triton

    compiled: list[str] = []
    knobs = triton.knobs.runtime
    before = knobs.jit_post_compile_hook

    def hook(**kwargs: object) -> bool:
        compiled.append(str(kwargs.get("repr", kwargs.get("key"))))
        return False

    knobs.jit_post_compile_hook = hook
    try:
        yield compiled
    finally:
        knobs.jit_post_compile_hook = before
