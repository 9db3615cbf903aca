"""What a decode step's linears cost at M rows (GPU): Llama-3.1-8B's projections in bf16.

    python -m troupe.ops.linear_rows_bench [--rows 1 64 128 192 256 384 512]

Issue 9's 8B target is a fraction of the workload floor, which counts each step's weights read
once at copy bandwidth. That holds only while the step's GEMMs are memory-bound. This times the
32 layers' qkv, o, gate_up and down plus lm_head (torch.nn.functional.linear, cuBLAS) at each
row count, replayed from one CUDA graph with L2 flushed by the weights themselves (15 GB), and
prints the time against the weight read (bytes / measured copy bandwidth) and the matmul rate:
past the row count where the rate nears the bf16 peak, a step of that many rows cannot meet the
floor's weight term however the attention is done.
"""

from __future__ import annotations

import argparse

import torch
import triton.testing
from troupe.ops.card_rates import copy_bandwidth

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 4096, 14336, 32, 128256
Q_SIZE, KV_SIZE = 4096, 1024  # 32 q heads, 8 kv heads, head_dim 128
# (out, in) of each projection, once per layer; lm_head once
LAYER_SHAPES = [
    (Q_SIZE + 2 * KV_SIZE, HIDDEN),
    (HIDDEN, Q_SIZE),
    (2 * INTERMEDIATE, HIDDEN),
    (HIDDEN, INTERMEDIATE),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 128, 192, 256, 384, 512])
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)

    def weight(out: int, inp: int) -> torch.Tensor:
        return torch.randn(out, inp, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02

    layers = [[weight(o, i) for o, i in LAYER_SHAPES] for _ in range(LAYERS)]
    lm_head = weight(VOCAB, HIDDEN)
    weights = [w for layer in layers for w in layer] + [lm_head]
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    params = weight_bytes // 2
    copy = copy_bandwidth()
    floor_ms = weight_bytes / copy * 1e3  # one read at the copy rate, as the floors count it
    name = torch.cuda.get_device_name()
    print(f"{name}: copy {copy / 1e12:.2f} TB/s; weights {weight_bytes / 1e9:.2f} GB, read in")
    print(f"{floor_ms:.2f} ms at copy bandwidth\n")
    print(f"{'rows':>5} {'ms':>8} {'x read':>7} {'TFLOP/s':>8}")
    for rows in args.rows:
        x = torch.randn(rows, HIDDEN, generator=gen, device="cuda", dtype=torch.bfloat16)
        wide = torch.randn(rows, INTERMEDIATE, generator=gen, device="cuda", dtype=torch.bfloat16)

        def step(x: torch.Tensor = x, wide: torch.Tensor = wide) -> None:
            for qkv, o, gate_up, down in layers:
                torch.nn.functional.linear(x, qkv)
                torch.nn.functional.linear(x, o)
                torch.nn.functional.linear(x, gate_up)
                torch.nn.functional.linear(wide, down)
            torch.nn.functional.linear(x, lm_head)

        ms = triton.testing.do_bench_cudagraph(step)
        tflops = 2 * params * rows / (ms * 1e-3) / 1e12
        print(f"{rows:>5} {ms:>8.2f} {ms / floor_ms:>7.2f} {tflops:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
