"""The PTX blocks of the quantized decode GEMVs (kernels/half2_ptx.py) run by a small
emulator of the few instructions it uses, on the CPU: each asm block against the products it
must sum (which nibble or code meets which x), in the Q4_0 and e4m3 layouts. The GPU tests
run the real thing; this one catches a wrong mask, shift or operand without a GPU."""

from __future__ import annotations

import re

import numpy as np
import torch
from troupe.kernels.half2_ptx import FP8_ASM, INT4_ASM
from troupe.kernels.quant_int4 import Q_SCALE

Regs = dict[str, int]


def _f16(bits: int) -> float:
    return float(np.array([bits & 0xFFFF], dtype=np.uint16).view(np.float16)[0])


def _bits16(value: float) -> int:
    return int(np.array([value], dtype=np.float16).view(np.uint16)[0])


def _halves(bits: int) -> tuple[float, float]:
    return _f16(bits), _f16(bits >> 16)


def _pack(lo: float, hi: float) -> int:
    return _bits16(lo) | _bits16(hi) << 16


def _e4m3(byte: int) -> float:
    return float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float())


def run_ptx(asm: str, inputs: list[int]) -> float:
    """The asm's $0 (as fp32) for $1.. = inputs (32-bit patterns)."""
    regs: Regs = {f"${i + 1}": v & 0xFFFFFFFF for i, v in enumerate(inputs)}

    def val(op: str) -> int:
        return int(op, 0) & 0xFFFFFFFF if op[0].isdigit() else regs[op]

    for line in asm.splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith(".reg"):
            continue
        opcode, rest = line.split(None, 1)
        if m := re.fullmatch(r"\{(\w+), (\w+)\}, (\$?\w+)", rest):  # mov.b32 {lo, hi}, r
            regs[m[1]], regs[m[2]] = val(m[3]) & 0xFFFF, val(m[3]) >> 16
            continue
        d, *ops = [o.strip() for o in rest.split(",")]
        a = [val(o) for o in ops]
        if opcode == "mov.b32":
            regs[d] = a[0]
        elif opcode == "lop3.b32":
            assert a[3] == 0xEA, "only (a & b) | c"
            regs[d] = (a[0] & a[1]) | a[2]
        elif opcode == "prmt.b32":  # default mode: result byte i = byte (c >> 4i) & 7 of {b, a}
            pool = a[0] | a[1] << 32
            regs[d] = sum(((pool >> 8 * ((a[2] >> 4 * i) & 7)) & 0xFF) << 8 * i for i in range(4))
        elif opcode == "shr.u32":
            regs[d] = a[0] >> a[1]
        elif opcode in ("sub.f16x2", "add.f16x2", "mul.rn.f16x2", "fma.rn.f16x2"):
            (x0, x1), (y0, y1) = _halves(a[0]), _halves(a[1])
            z0, z1 = _halves(a[2]) if len(a) == 3 else (0.0, 0.0)
            if opcode == "sub.f16x2":
                regs[d] = _pack(x0 - y0, x1 - y1)
            elif opcode == "add.f16x2":
                regs[d] = _pack(x0 + y0, x1 + y1)
            else:  # exact in float64, one rounding to fp16
                regs[d] = _pack(x0 * y0 + z0, x1 * y1 + z1)
        elif opcode == "cvt.rn.f16x2.e4m3x2":
            regs[d] = _pack(_e4m3(a[0] & 0xFF), _e4m3(a[0] >> 8))
        elif opcode == "cvt.f32.f16":
            regs[d] = int(np.array([_f16(a[0])], dtype=np.float32).view(np.uint32)[0])
        elif opcode == "add.f32":
            f = np.array([a[0], a[1]], dtype=np.uint32).view(np.float32)
            regs[d] = int(np.array([f[0] + f[1]], dtype=np.float32).view(np.uint32)[0])
        else:
            raise AssertionError(f"the emulator lacks {opcode}")
    return float(np.array([regs["$0"]], dtype=np.uint32).view(np.float32)[0])


def test_fp8_asm_pairs_codes_with_their_x() -> None:
    """16 e4m3 codes in order as 4 words; x pairs (k, k+1) for k = 0, 2, .., 14."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        codes = rng.integers(0, 255, 16, dtype=np.uint8)
        codes[codes == 0x7F] = 0x7E  # no NaN
        q = np.array([_e4m3(int(c)) for c in codes])
        x = (rng.standard_normal(16) / 64).astype(np.float16).astype(np.float64)
        words = [int(w) for w in codes.view("<u4")]
        pairs = [_pack(x[k], x[k + 1]) for k in range(0, 16, 2)]
        got = run_ptx(FP8_ASM.value, words + pairs)
        want = float(q @ x)
        assert abs(got - want) <= 2e-3 * np.abs(q * x).sum()


def test_int4_asm_pairs_nibbles_with_their_x() -> None:
    """One Q4_0 group (byte j: element j low nibble, j + 16 high) as 4 little-endian words;
    x pairs of adjacent elements as the kernel passes them: word i's (4i, 4i+1), (4i+16, 4i+17), (4i+2, 4i+3), (4i+18, 4i+19)."""
    rng = np.random.default_rng(2)
    for _ in range(20):
        group = rng.integers(0, 256, 16, dtype=np.uint8)
        q = np.concatenate([group & 15, group >> 4]).astype(np.float64)
        x = rng.standard_normal(32).astype(np.float16).astype(np.float64)
        words = [int(w) for w in group.view("<u4")]
        pairs = []
        for i in range(4):
            for e in (4 * i, 4 * i + 16, 4 * i + 2, 4 * i + 18):
                pairs.append(_pack(x[e], x[e + 1]))
        got = run_ptx(INT4_ASM.value, words + pairs)
        want = float(q @ x) * Q_SCALE.value
        assert abs(got - want) <= 2e-3 * np.abs(q * x).sum() * Q_SCALE.value
