"""Fused Gumbel-max sampling on CUDA: one pass over the logits instead of ~30 tensor ops.

The torch path (sampler.gumbel_noise) materialises int64 [S, V] hashes through ~30
elementwise kernels: at 256 x 151936 that is ~20 GB of memory traffic, several ms per step on
an H200. This kernel computes the same hash per (row key, token id) in registers and keeps a
running argmax of logits / temperature + noise, so it reads the logits once.

Rows with temperature 0 take the plain argmax of their logits. Ties go to the lowest token id,
as torch.argmax. Each row's ids are split over several programs (num_splits: one program per
row left most SMs idle, so a draw over 151,936 ids was latency-bound); a second kernel picks
each row's winner among its splits' bests. The noise is bit-identical to the torch path's; the
log may differ by an ulp, which only matters at exact near-ties.

With a grammar's token bitmask (structured output: gpu/token_bitmask.py) the kernel reads each
token's bit beside its logit and treats a cleared one as -inf, as apply_token_bitmask does in
five passes over [S, V] (int32 gather, shift, and, compare, select: ~1.4 GB at 256 x 151936).
"""

from __future__ import annotations

import torch
from troupe.kernels.sm_count import num_sms

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA torch
    triton = None


def available(logits: torch.Tensor) -> bool:
    """Whether the fused kernel can run on these logits (CUDA, Triton present)."""
    return triton is not None and logits.is_cuda


if triton is not None:

    @triton.jit
    def _mix32(x):  # type: ignore[no-untyped-def]
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x2C1B3C6D
        return x ^ (x >> 16)

    # num_splits is a plain argument: specialized on its value (== 1, % 16), each row count
    # that changes those would compile the kernels anew mid-serving
    @triton.jit(do_not_specialize=["num_splits"])  # type: ignore[untyped-decorator]
    def _gumbel_argmax_kernel(  # type: ignore[no-untyped-def]
        logits_ptr,
        row_stride,
        temperature_ptr,
        keys_ptr,
        part_value_ptr,  # fp32 [S, num_splits]: each split's best value ...
        part_id_ptr,  # int32 [S, num_splits]: ... and the lowest id that has it
        vocab_size,
        chunk,  # ids per split, a multiple of BLOCK
        num_splits,
        mask_ptr,
        mask_stride,
        BLOCK: tl.constexpr,
        MASKED: tl.constexpr,
    ):
        row = tl.program_id(0)
        split = tl.program_id(1)
        temperature = tl.load(temperature_ptr + row)
        is_random = temperature > 0.0
        divisor = tl.where(is_random, temperature, 1.0)
        key0 = tl.load(keys_ptr + 2 * row).to(tl.uint32)
        key1 = tl.load(keys_ptr + 2 * row + 1).to(tl.uint32)
        base = logits_ptr + row.to(tl.int64) * row_stride
        lo = split * chunk
        hi = tl.minimum(lo + chunk, vocab_size)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_id = tl.zeros((BLOCK,), tl.int32) + lo
        for start in range(lo, hi, BLOCK):
            ids = start + tl.arange(0, BLOCK)
            mask = ids < hi
            logit = tl.load(base + ids, mask=mask, other=float("-inf")).to(tl.float32)
            x = _mix32(ids.to(tl.uint32) + 0x632BE5AB)
            x = _mix32(x ^ key0)
            x = _mix32(x + key1)
            uniform = ((x >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # as sampler.py
            noise = -tl.log(-tl.log(uniform))
            value = tl.where(is_random, logit / divisor + noise, logit)
            if MASKED:  # the grammar's bit per token: bit id % 32 of word id // 32
                word = tl.load(mask_ptr + row.to(tl.int64) * mask_stride + (ids >> 5), mask=mask)
                mask = mask & (((word >> (ids & 31)) & 1) != 0)
            value = tl.where(mask, value, float("-inf"))
            better = value > best  # strict: each lane keeps its lowest id on ties
            best = tl.where(better, value, best)
            best_id = tl.where(better, ids, best_id)
        top = tl.max(best, axis=0)
        tl.store(part_value_ptr + row * num_splits + split, top)
        tl.store(part_id_ptr + row * num_splits + split, tl.min(tl.where(best == top, best_id, hi)))

    @triton.jit(do_not_specialize=["num_splits"])  # type: ignore[untyped-decorator]
    def _merge_splits_kernel(  # type: ignore[no-untyped-def]
        part_value_ptr, part_id_ptr, out_ptr, num_splits, BLOCK_S: tl.constexpr
    ):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK_S)
        valid = offs < num_splits
        value = tl.load(part_value_ptr + row * num_splits + offs, mask=valid, other=float("-inf"))
        ids = tl.load(part_id_ptr + row * num_splits + offs, mask=valid, other=0)
        top = tl.max(value, axis=0)
        # splits hold ascending ids: the first split with the top value has the lowest id; an
        # all -inf row gives split 0's first id, 0, as torch.argmax does
        first = tl.min(tl.where((value == top) & valid, offs, BLOCK_S), axis=0)
        winner = tl.sum(tl.where(offs == first, ids, 0), axis=0)
        tl.store(out_ptr + row, winner.to(tl.int64))


_BLOCK = 2048
_PROGRAMS_PER_SM = 8  # a draw of 256 rows x 151,936 ids took 235 us in one program per row


def num_splits(num_rows: int, vocab_size: int, device: torch.device) -> int:
    """Programs per row: enough rows x splits to fill every SM several times over, at least
    one BLOCK of ids per split."""
    wanted = -(-_PROGRAMS_PER_SM * num_sms(device) // num_rows)
    return max(1, min(wanted, -(-vocab_size // _BLOCK)))


def split_shape(num_rows: int, vocab_size: int, device: torch.device) -> tuple[int, int]:
    """(splits, ids per split): num_splits' count with whole BLOCKs per split and none empty."""
    splits = num_splits(num_rows, vocab_size, device)
    chunk = -(-vocab_size // (splits * _BLOCK)) * _BLOCK
    return -(-vocab_size // chunk), chunk


def merge_width(splits: int) -> int:
    """The merge kernel's BLOCK_S (a constexpr: one compiled kernel per width)."""
    return 1 << max(0, splits - 1).bit_length()


def warm_up_rows(max_rows: int, vocab_size: int, device: torch.device) -> list[int]:
    """The fewest row counts in [1, max_rows] whose draws compile every merge width a draw of
    up to max_rows rows uses: the first row count of each width."""
    first: dict[int, int] = {}
    for rows in range(1, max_rows + 1):
        first.setdefault(merge_width(split_shape(rows, vocab_size, device)[0]), rows)
    return sorted(first.values())


def gumbel_argmax(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    keys: torch.Tensor,
    bitmask: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 [S]: argmax(logits / t + gumbel(keys)) where t > 0, argmax(logits) where t == 0,
    over the tokens `bitmask` (int32 [S, >= V/32], when given) allows."""
    assert triton is not None, "gumbel_argmax needs triton"
    num_rows, vocab_size = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    splits, chunk = split_shape(num_rows, vocab_size, logits.device)
    part_value = torch.empty(num_rows, splits, dtype=torch.float32, device=logits.device)
    part_id = torch.empty(num_rows, splits, dtype=torch.int32, device=logits.device)
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    masks = out if bitmask is None else bitmask.contiguous()  # unread without a bitmask
    _gumbel_argmax_kernel[(num_rows, splits)](
        logits,
        logits.stride(0),
        temperature.float().contiguous(),
        keys.contiguous(),
        part_value,
        part_id,
        vocab_size,
        chunk,
        splits,
        masks,
        masks.stride(0),
        BLOCK=_BLOCK,
        MASKED=bitmask is not None,
    )
    _merge_splits_kernel[(num_rows,)](part_value, part_id, out, splits, BLOCK_S=merge_width(splits))
    return out


def warm_up(vocab_size: int, device: torch.device, dtype: torch.dtype, max_rows: int) -> None:
    """Compile every form a draw of up to `max_rows` rows of `dtype` logits launches now, not
    while serving: Triton compiles a kernel on its first launch where its on-disk cache lacks it
    (a fresh machine or container). A server's first request with a temperature spent ~0.4 s
    in the draw's compilation on the H200's host (py-spy, docs/benchmarks.md session 18), and
    a cold engine's first 300-request burst ~0.3 s in four merge widths (session 27)."""
    words = -(-vocab_size // 32)  # gpu/token_bitmask.py's row width
    for rows in warm_up_rows(max_rows, vocab_size, device):
        logits = torch.zeros(rows, vocab_size, device=device, dtype=dtype)
        temperature = torch.ones(rows, device=device)
        keys = torch.zeros(rows, 2, dtype=torch.int64, device=device)
        gumbel_argmax(logits, temperature, keys)
        full = torch.full((rows, words), -1, dtype=torch.int32, device=device)
        gumbel_argmax(logits, temperature, keys, full)
