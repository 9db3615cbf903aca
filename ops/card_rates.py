"""What the GPU at hand moves and computes: the two rates every floor in ops/ is built from.

    copy_bandwidth()  read + write bytes per second of a 1 GiB device-to-device copy (median)
    matmul_peak()     bf16 FLOP/s of an 8,192^3 matmul (median)

The H200's figures (4.26 TB/s, 773 TFLOP/s) are the constants issue targets are set against
(ops/bench_offline.py); a bench that also prints the floor at the rates measured here says how
close a run on another card (an H100) came to that card's own floor.
"""

from __future__ import annotations

import torch
import triton.testing


def copy_bandwidth() -> float:
    """Bytes read plus bytes written per second by a 1 GiB bf16 copy on the current device."""
    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() * src.element_size() / (float(ms) * 1e-3)


def matmul_peak() -> float:
    """bf16 FLOP/s of one 8,192 x 8,192 x 8,192 matmul on the current device."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return 2 * 8192**3 / (float(ms) * 1e-3)
