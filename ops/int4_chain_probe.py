"""Where the int4 batch-1 chain loses against its launches timed alone (GPU; issue 16).

    python3 -m troupe.ops.int4_chain_probe

quant_bench's int4 step (Llama-3.1-8B: 32 x [qkv, o, gate_up, down] + lm_head, one row, the
engine's GEMV launches) takes ~1.75 ms on an H200, while int4_gemv_anatomy's launches of each
shape timed 32 in a row add up to ~1.50 ms for the layers. This times the same launches in
other orders and groupings, each captured in a CUDA graph (quant_bench.timed):

    chain            the step as quant_bench runs it
    layers           the step without lm_head
    grouped          the same launches, 32 of each shape in a row, then lm_head
    pdl off          the chain without programmatic dependent launch
    whole-K off      the chain with o and qkv split along K (gemv_launch's whole_k_groups 0)
    l2 ahead         before its wait each program asks L2 for all its tiles after the first
                     (Int4ColsGemv.l2_ahead), not only the first into registers
    waves 1, 3       the split launches sized for 1 or 3 programs an SM (2 in the engine)
    bf16             the same step with bf16 weights through torch (quant_bench's baseline)
    <shape> x32      one shape's 32 launches alone; lm_head x8 (8 vocab-sized weights)

Prints ms per graph and, for the chain, what the launches alone would add up to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from troupe.kernels.quant_int4 import INT4_COLS_GEMV, Int4Cols, Int4ColsGemv, int4_cols_matmul
from troupe.ops.quant_bench import HIDDEN, INTER, LAYERS, SHAPES, VOCAB, timed

NAMES = ("qkv", "o", "gate_up", "down")


def random_int4(n: int, k: int, device: torch.device) -> Int4Cols:
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
    scale = (torch.rand(n, k // 32, device=device) * 0.004 + 0.001).half()
    return Int4Cols.from_rows(packed, scale, (-8 * scale.float()).half())


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(device))
    layers = [[random_int4(n, k, device) for n, k in SHAPES] for _ in range(LAYERS)]
    heads = [random_int4(VOCAB, HIDDEN, device) for _ in range(8)]
    xs = {k: torch.randn(1, k, device=device, dtype=torch.bfloat16) for k in (HIDDEN, INTER)}

    def run(ws: list[Int4Cols], gemv: Int4ColsGemv = INT4_COLS_GEMV) -> Callable[[], None]:
        def step() -> None:
            for w in ws:
                int4_cols_matmul(xs[w.shape[1]], w, gemv)

        return step

    ahead = replace(INT4_COLS_GEMV, l2_ahead=True)
    for w in [*layers[0], heads[0]]:  # the prefetch must not change a bit of the result
        x = xs[w.shape[1]]
        same = torch.equal(int4_cols_matmul(x, w), int4_cols_matmul(x, w, ahead))
        print(f"{w.shape[0]} x {w.shape[1]}: l2 ahead {'equal' if same else 'DIFFERS'}")
    chain = [w for layer in layers for w in layer] + heads[:1]
    grouped = [layer[i] for i in range(len(SHAPES)) for layer in layers] + heads[:1]
    alone = {}
    for i, name in enumerate(NAMES):
        alone[name] = timed(run([layer[i] for layer in layers]), device) * 1e3
        print(f"{name} x{LAYERS}: {alone[name]:.3f} ms ({alone[name] / LAYERS * 1e3:.2f} us each)")
    head = timed(run(heads), device) * 1e3 / len(heads)
    print(f"lm_head x{len(heads)}: {head * len(heads):.3f} ms ({head * 1e3:.1f} us each)")
    rows = {
        "chain": run(chain),
        "layers": run(chain[:-1]),
        "grouped": run(grouped),
        "pdl off": run(chain, replace(INT4_COLS_GEMV, pdl=False)),
        "whole-K off": run(chain, replace(INT4_COLS_GEMV, whole_k_groups=0)),
        "l2 ahead": run(chain, replace(INT4_COLS_GEMV, l2_ahead=True)),
        "l2 ahead, whole-K off": run(
            chain, replace(INT4_COLS_GEMV, l2_ahead=True, whole_k_groups=0)
        ),
        "l2 ahead, waves 1": run(chain, replace(INT4_COLS_GEMV, l2_ahead=True, waves=1)),
        "waves 1": run(chain, replace(INT4_COLS_GEMV, waves=1)),
        "waves 3": run(chain, replace(INT4_COLS_GEMV, waves=3)),
    }
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for n, k in SHAPES * LAYERS]
    dense.append(torch.randn(VOCAB, HIDDEN, device=device, dtype=torch.bfloat16))

    def bf16() -> None:
        for w in dense:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    base = timed(bf16, device) * 1e3
    print(f"bf16: {base:.3f} ms")
    for name, step in rows.items():
        t = timed(step, device) * 1e3
        print(f"{name}: {t:.3f} ms, {base / t:.2f}x bf16")
    print(f"the chain's launches alone add up to {sum(alone.values()) + head:.3f} ms")


if __name__ == "__main__":
    main()
