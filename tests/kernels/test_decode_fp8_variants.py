"""The fp8-KV decode kernel (kernels/decode_attention_fp8.py) against the torch reference.

CPU: Triton under TRITON_INTERPRET=1, fp32 q; GPU (-m gpu): bf16, real head sizes.
The kernel rounds q and the probabilities to fp16: against a reference fed the same
fp16-rounded q only the probabilities' rounding is left (about 1e-4 here).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from fp8_batch import fp8_batch, rel_err
from troupe.kernels import decode_attention, reference
from troupe.kernels.decode_attention import DecodeConfig, paged_decode_attention_triton
from troupe.kernels.fp8_tile import Fp8Convert
from troupe.kernels.kv_quant import FP8_DTYPE, quantize
from troupe.kernels.paged_batch import make_paged_batch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_decode_matches_reference(device: str) -> None:
    lens = [(n - 1, 1) for n in ([1, 22, 13] if device == "cpu" else [1, 500, 3000, 17])]
    batch, k_scale, v_scale = fp8_batch(lens, device, seed=11, cpu_q_heads=8)
    q16 = batch.q.half().to(batch.q.dtype)
    args = (batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    bound = 1e-2 if device == "cuda" else 1e-3
    config = DecodeConfig()
    for num_splits, window in ((1, 0), (3, 7)):
        ref = reference.paged_decode_attention(
            q16, *args, k_scale=k_scale, v_scale=v_scale, sliding_window=window
        )
        out = paged_decode_attention_triton(
            batch.q, *args, num_splits=num_splits, config=config, sliding_window=window,
            k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        assert rel_err(out, ref) < bound, (num_splits, window)
    # the scales are applied: the same bytes read as if unscaled are far off
    plain = reference.paged_decode_attention(
        batch.q, batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, 0.25, batch.max_seq_len,
    )  # fmt: skip
    assert rel_err(plain, ref) > 0.5


def test_fp8_decode_skips_rows_past_num_valid() -> None:
    batch, k_scale, v_scale = fp8_batch([(8, 1), (20, 1), (3, 1)], "cpu", seed=12, cpu_q_heads=8)
    out = torch.full_like(batch.q, float("nan"))
    paged_decode_attention_triton(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
        batch.max_seq_len, num_splits=2, config=DecodeConfig(), out=out,
        num_valid=torch.tensor([2], dtype=torch.int32), k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    assert not out[:2].isnan().any()
    assert out[2].isnan().all()  # left alone


def test_fp8_decode_head_dim_off_powers_of_two() -> None:
    """head_dim 24: the kernel pads the head to 32 columns and masks the padding off."""
    batch = make_paged_batch(
        [(9, 1), (30, 1)], num_q_heads=4, num_kv_heads=2, head_dim=24, block_size=4,
        dtype=torch.float32, device="cpu", seed=14,
    )  # fmt: skip
    scales = torch.tensor([1 / 64, 1 / 32])
    k8 = quantize(batch.k_cache.flatten(0, 1), scales).view(batch.k_cache.shape)
    v8 = quantize(batch.v_cache.flatten(0, 1), scales).view(batch.v_cache.shape)
    args = (batch.q, k8, v8, batch.block_tables, batch.seq_lens, 0.25, batch.max_seq_len)
    out = paged_decode_attention_triton(*args, k_scale=scales, v_scale=scales)
    ref = reference.paged_decode_attention(
        batch.q.half().float(), k8, v8, *args[3:], k_scale=scales, v_scale=scales
    )
    assert rel_err(out, ref) < 1e-3


@triton.jit
def _convert_kernel(x_ptr, out_ptr):
    rows = tl.arange(0, 16)  # 16 rows of 16 bytes
    offs = rows[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(out_ptr + offs, tl.load(x_ptr + offs).to(tl.float16))


@pytest.mark.parametrize("device", DEVICES)
def test_every_e4m3_byte_converts_exactly(device: str) -> None:
    """All 256 bytes (subnormals, zeros, both signs; NaN bytes 0x7F/0xFF excepted), in order,
    through the kernel's fp8 -> fp16 cast."""
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).to(device)
    out = torch.empty(256, dtype=torch.float16, device=device)
    _convert_kernel[(1,)](x, out)
    expected = x.float().cpu()
    finite = ~expected.isnan()
    assert int(finite.sum()) == 254
    assert torch.equal(out.float().cpu()[finite], expected[finite])
    assert math.copysign(1.0, float(out[0x80])) == -1.0  # -0 keeps its sign


def test_engine_default_is_the_fp8_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    """config=None (the engine path) takes FP8_DEFAULT_CONFIG for an fp8 cache, read at call
    time: its split policy picks the splits."""
    batch, k_scale, v_scale = fp8_batch([(40, 1), (5, 1)], "cpu", seed=13, cpu_q_heads=8)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    # 41 tokens at most: 2 splits of 32 and 9 (2 programs per SM: 4 on the interpreter's 4
    # SMs); the default split policy takes 1
    short_splits = DecodeConfig(min_split=4, programs_per_sm=2)
    monkeypatch.setattr(decode_attention, "FP8_DEFAULT_CONFIG", short_splits)
    engine = paged_decode_attention_triton(*args, **scales)
    assert torch.equal(engine, paged_decode_attention_triton(*args, num_splits=2, **scales))
    assert not torch.equal(engine, paged_decode_attention_triton(*args, num_splits=1, **scales))


@pytest.mark.gpu
@pytest.mark.parametrize("convert", [Fp8Convert.V_AT_LOAD, Fp8Convert.KV_AT_LOAD])
def test_tiles_converted_where_loaded_give_the_same_attention(convert: Fp8Convert) -> None:
    """fp8_tile.f16_at_load (inline PTX, CUDA only) against the default conversion: the same
    exact fp16 values, so the same output up to the order of the fp16 dot's sums."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    batch, k_scale, v_scale = fp8_batch([(n - 1, 1) for n in (1, 500, 3000, 17)], "cuda", seed=9)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25,
            batch.max_seq_len)  # fmt: skip
    ref = reference.paged_decode_attention(*args, k_scale=k_scale, v_scale=v_scale)
    base = paged_decode_attention_triton(*args, k_scale=k_scale, v_scale=v_scale)
    config = DecodeConfig(128, 4, 2, fp8_convert=convert)
    for num_splits in (1, 3):
        out = paged_decode_attention_triton(
            *args, num_splits=num_splits, k_scale=k_scale, v_scale=v_scale, config=config
        )
        assert rel_err(out, ref) < 1e-2
        assert rel_err(out, base) < 1e-3


def test_tiles_converted_where_loaded_compile_without_byte_reads() -> None:
    """Static (sm_90 SASS from Triton's own ptxas, no GPU; a child process: the offline
    compile needs Triton functions, not the interpreter's): converted where loaded, the V tile
    reaches the tensor cores through ldmatrix, not shared-memory byte reads, in fewer warp
    instructions per KV byte than the default's (ops/fp8_compile_check.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "troupe.ops.fp8_compile_check"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        head = re.match(r"fp8-kv bn=(\d+)\s+w=(\d+) st=(\d+) (\w+)", line)
        if head:
            counts = dict(re.findall(r"([A-Z][A-Z0-9.]*|stack|per byte) (\d+(?:\.\d+)?)", line))
            rows[head.groups()] = {k: float(v) for k, v in counts.items()}
    default, pinned = rows[("128", "2", "3", "at_dot")], rows[("128", "4", "2", "v_at_load")]
    assert default["LDS.U8"] > 0
    assert pinned["LDS.U8"] == 0 and pinned["LDSM"] > 0 and pinned["stack"] == 0
    assert pinned["per byte"] < 0.8 * default["per byte"]
