"""What StreamingLLM's positions cost per decode step and layer on the CPU, three ways:

    plain      sinks + window keys as stored, one SDPA (what attention without the cache-position
               rule costs: the floor)
    ours       keys stay rotated at absolute positions; the few sink keys are rotated further
               in the step (kernels/streaming_attention.py `_decode`)
    two_query  the same keys; a second query rotated at its cache position scores the sinks,
               both in one 2D-wide SDPA under a mask (what `_chunk` does for prompt chunks)
    rerotate   keys kept before rotary (the paper's implementation): every step rotates all
               sinks + window keys at their cache positions, then one SDPA

    python -m troupe.ops.streaming_attention_bench            # SmolLM2 and Llama-8B shapes

Prints one JSON line per shape: median milliseconds per call of each (after a warm-up), on one
thread.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from troupe.kernels.reference import _rotate
from troupe.kernels.rope_cache import build_cos_sin_cache
from troupe.kernels.streaming_attention import StreamingMetadata, _chunk, streaming_attention

SHAPES = {"smollm2-135m": (9, 3, 64), "llama-3.1-8b": (32, 8, 128)}


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(
    heads: int, kv_heads: int, dim: int, *, sinks: int, window: int, reps: int
) -> dict[str, float]:
    bs, pos = 16, 20_000  # a query far past the window
    num_blocks = -(-(pos + 1) // bs)
    k_cache = torch.randn(num_blocks, bs, kv_heads, dim)
    v_cache = torch.randn(num_blocks, bs, kv_heads, dim)
    table = torch.arange(num_blocks, dtype=torch.int32)[None]
    q = torch.randn(1, heads, dim)
    cos_sin = build_cos_sin_cache(dim, pos + 1, 10000.0, None, torch.float32, "cpu")
    n = sinks + window
    keep = torch.cat((torch.arange(sinks), torch.arange(pos + 1 - window, pos + 1)))
    scale = dim**-0.5
    meta = StreamingMetadata(
        torch.tensor([window], dtype=torch.int32),
        torch.tensor([sinks], dtype=torch.int32),
        torch.tensor([min(pos, n - 1)]),
    )

    def kept(cache: torch.Tensor) -> torch.Tensor:
        rows = cache.view(-1, kv_heads, dim).index_select(0, keep)
        return rows[None].transpose(1, 2)

    def plain() -> object:
        return F.scaled_dot_product_attention(
            q[:, :, None], kept(k_cache), kept(v_cache), scale=scale, enable_gqa=True
        )

    def ours() -> object:
        return streaming_attention(
            q, None, k_cache, v_cache, table, torch.tensor([pos + 1]), torch.tensor([0, 1]),
            meta, scale, cos_sin,
        )  # fmt: skip

    def two_query() -> object:
        return _chunk(q, q, (k_cache, v_cache, None, None), table[0], pos + 1, sinks, window,
                      scale)  # fmt: skip

    def rerotate() -> object:
        cos, sin = cos_sin[:n].chunk(2, dim=-1)
        keys = kept(k_cache)[0].transpose(0, 1)  # [n, Hkv, D]
        keys = _rotate(keys, cos[:, None], sin[:, None])
        q_rot = _rotate(q, cos[n - 1 :, None], sin[n - 1 :, None])
        return F.scaled_dot_product_attention(
            q_rot[:, :, None], keys[None].transpose(1, 2), kept(v_cache), scale=scale,
            enable_gqa=True,
        )  # fmt: skip

    return {name: round(_median_ms(fn, reps), 3) for name, fn in
            (("plain", plain), ("ours", ours), ("two_query", two_query),
             ("rerotate", rerotate))}  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core: a shared machine's other work does not skew threads
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for window in (252, 1020):
            ms = measure(heads, kv_heads, dim, sinks=4, window=window, reps=50)
            print(json.dumps({"shape": name, "sinks": 4, "window": window, "ms": ms}))


if __name__ == "__main__":
    main()
