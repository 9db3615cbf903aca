"""Int8Blocks (per-group scales) -> per-row int8 for fbgemm's dynamic int8 linear.

fbgemm takes one scale per output row, so the exact weight w = scale_g * q is re-quantised
once at load: r = max|w_row| / 127, w' = round(w / r) (error <= r / 2; gpu/quant_linear.py).
Done slice by slice (no fp32 copy of a whole vocabulary) in few passes: the row maximum comes
from the codes' per-group extremes (|d q| = |d| |q| exactly in fp32, and rounding is monotone,
so max_g |d_g| max|q_g| is the maximum of the expanded row, bit for bit), and w / r from one
int8 x fp32 multiply written into a reused buffer. Equal to dequantize-then-divide to the bit
(tests/gpu/test_gguf_quant.py).
"""

from __future__ import annotations

import torch
from troupe.gpu.gguf_quant import Int8Blocks

_SLICE_ROWS = 4096


def per_row_int8(blocks: Int8Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [N, K], scale fp32 [N]) with w ~= codes * scale[:, None]."""
    n, k = blocks.shape
    g = blocks.group_size
    row_scale = torch.empty(n)
    row_codes = torch.empty((n, k), dtype=torch.int8)
    buffer = torch.empty(min(n, _SLICE_ROWS) * k)
    for start in range(0, n, _SLICE_ROWS):
        end = min(n, start + _SLICE_ROWS)
        q = blocks.codes[start:end].view(end - start, k // g, g)
        d = blocks.scale[start:end]
        # max |q| per group in int16 (|-128| does not fit int8)
        q_max = torch.maximum(q.amax(-1).to(torch.int16), q.amin(-1).to(torch.int16).neg())
        scale = (q_max * d.abs()).amax(dim=1).clamp_min(1e-30) / 127
        row_scale[start:end] = scale
        w = buffer[: (end - start) * k].view(end - start, k // g, g)
        torch.mul(q, d[..., None], out=w)  # the exact fp32 weight, as dequantize() makes it
        w.div_(scale[:, None, None]).round_().clamp_(-127, 127)
        row_codes[start:end].view(end - start, k // g, g).copy_(w)
    return row_codes, row_scale
