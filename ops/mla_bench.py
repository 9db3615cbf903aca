"""MLA kernel benchmark (GPU): absorbed decode and both prefill forms at DeepSeek-V2-Lite shape.

    python -m troupe.ops.mla_bench [--sweep] [--num-seqs 256] [--context 1024] [--prefill-only]
    python -m troupe.ops.mla_bench --sweep-variants    (ops/mla_variant_sweep.py, about a minute)

--sweep: the default launch at other tile sizes, warps, stages and split counts.

16 heads, kv_lora_rank 512, rope 64, nope 128, v 128, bf16, block_size 16, blocks shuffled.
Decode: num_seqs sequences of `context` tokens; the rate is bytes/s over what the kernel must
read and write (the latent cache rows [c | k_r] of every sequence once, q_lat, q_rope and
o_lat) against copy bandwidth (read + write of 1 GiB). "op" adds the absorption GEMMs
(q_nope @ W_uk, o_lat @ W_uv: kernels/mla_ops.mla_attention). Prefill: chunks through the
absorbed kernel (each row rereads its context) and the expanded form (kernels/mla_prefill.py:
the latent blocks decompressed to per-head K/V, the paged prefill kernel), in ms, with each
form's own FLOPs (absorbed: H * (2L + R) per query-key pair plus the absorption GEMMs;
expanded: H * (Dn + R + Dv) per pair plus the expansion of every context token) and the
speedup; the q_len sweep at 8 x 2,048 shows where EngineConfig.mla_expand_min_tokens belongs.
Times are medians of triton.testing.do_bench; the decode error is against kernels/mla_reference
on 8 sequences, the prefill "diff" is expanded against absorbed.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import torch
from troupe.kernels.mla_decode import DEFAULT_CONFIG, MlaLaunch, mla_attention_triton
from troupe.kernels.mla_ops import mla_attention
from troupe.kernels.mla_prefill import mla_prefill
from troupe.kernels.mla_reference import mla_decode_absorbed
from troupe.ops.bench_timing import median_ms
from troupe.ops.card_rates import copy_bandwidth
from troupe.ops.mla_variant_sweep import sweep_variants

HEADS, LORA, ROPE, NOPE, V, BLOCK_SIZE = 16, 512, 64, 128, 128, 16
DTYPE = torch.bfloat16


def problem(num_seqs: int, context: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    per_seq = -(-context // BLOCK_SIZE)
    num_blocks = num_seqs * per_seq
    order = torch.randperm(num_blocks, generator=gen, device="cuda")

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(DTYPE)

    return {
        "cache": randn(num_blocks, BLOCK_SIZE, LORA + ROPE),
        "table": order.view(num_seqs, per_seq).to(torch.int32),
        "seq_lens": torch.full((num_seqs,), context, dtype=torch.int32, device="cuda"),
        "q_nope": randn(num_seqs, HEADS, NOPE),
        "q_rope": randn(num_seqs, HEADS, ROPE),
        "kv_b": randn(HEADS * (NOPE + V), LORA, scale=LORA**-0.5),
    }


def rel_error(out: torch.Tensor, p: dict[str, torch.Tensor], scale: float, rows: int = 8) -> float:
    ref = mla_decode_absorbed(
        p["q_nope"][:rows].float(), p["q_rope"][:rows].float(), p["cache"], p["table"][:rows],
        p["seq_lens"][:rows], p["kv_b"].float(), V, scale,
    )  # fmt: skip
    return float((out[:rows].float() - ref).norm() / ref.norm())


def decode(num_seqs: int, context: int, sweep: bool, copy_bw: float) -> None:
    p = problem(num_seqs, context, seed=num_seqs)
    scale = (NOPE + ROPE) ** -0.5
    w = p["kv_b"].view(HEADS, NOPE + V, LORA)
    q_lat = torch.einsum("shd,hdl->shl", p["q_nope"], w[:, :NOPE]).contiguous()
    seq = torch.arange(num_seqs, dtype=torch.int32, device="cuda")
    elem = p["cache"].element_size()
    moved = (num_seqs * context * (LORA + ROPE) + 2 * q_lat.numel() + p["q_rope"].numel()) * elem
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device="cuda")

    def op() -> torch.Tensor:
        return mla_attention(p["q_nope"], p["q_rope"], p["cache"], p["kv_b"], p["table"],
                             p["seq_lens"], qsl, V, scale, True)  # fmt: skip

    err = rel_error(op(), p, scale)
    ms = median_ms(op)
    print(f"S={num_seqs} ctx={context} op (absorb + kernel + W_uv, default launch): "
          f"{ms * 1e3:8.1f} us  rel err {err:.1e}")  # fmt: skip
    configs: list[tuple[MlaLaunch, int | None]] = [(DEFAULT_CONFIG, None)]
    if sweep:
        configs += [
            (dataclasses.replace(DEFAULT_CONFIG, block_n=bn, num_warps=nw, num_stages=ns), splits)
            for bn, nw, ns, splits in itertools.product(
                (16, 32, 64), (4, 8), (1, 2, 3), (1, 2, 4, 8)
            )
        ]
    for config, splits in configs:

        def kernel(config: MlaLaunch = config, splits: int | None = splits) -> torch.Tensor:
            return mla_attention_triton(q_lat, p["q_rope"], p["cache"], p["table"], seq,
                                        p["seq_lens"], scale, num_splits=splits, config=config)  # fmt: skip

        try:
            kernel()
            ms = median_ms(kernel)
        except Exception as exc:  # a sweep tile the GPU cannot hold
            print(f"  {config} splits={splits}: failed ({type(exc).__name__})")
            continue
        bw = moved / (ms * 1e-3)
        print(
            f"  kernel bn={config.block_n:>2} warps={config.num_warps} stages={config.num_stages}"
            f" splits={splits or 'auto':>4}  {ms * 1e3:8.1f} us  {bw / 1e12:5.2f} TB/s "
            f"({bw / copy_bw:4.0%} of copy)"
        )


def prefill(num_seqs: int, context: int, q_len: int) -> None:
    """num_seqs chunks of q_len new tokens at the end of `context` cached tokens each, through
    both forms: absorbed rows (kernels/mla_ops.py) and expanded K/V (kernels/mla_prefill.py)."""
    p = problem(num_seqs, context, seed=7)
    scale = (NOPE + ROPE) ** -0.5
    rows = num_seqs * q_len
    gen = torch.Generator(device="cuda").manual_seed(8)
    q_nope = torch.randn(rows, HEADS, NOPE, generator=gen, device="cuda").to(DTYPE)
    q_rope = torch.randn(rows, HEADS, ROPE, generator=gen, device="cuda").to(DTYPE)
    qsl = torch.arange(0, rows + 1, q_len, dtype=torch.int32, device="cuda")
    args = (q_nope, q_rope, p["cache"], p["kv_b"], p["table"], p["seq_lens"], qsl, V, scale)

    def absorbed() -> torch.Tensor:
        return mla_attention(*args, False)

    blocks = p["table"].flatten().long()  # every entry a sequence's own block
    tables = torch.arange(blocks.numel(), dtype=torch.int32, device="cuda").view(num_seqs, -1)

    def expanded() -> torch.Tensor:
        return mla_prefill(*args[:4], blocks, tables, *args[5:], q_len, context)

    a, e = absorbed().float(), expanded().float()
    diff = float((e - a).norm() / a.norm())
    ms_a, ms_e = median_ms(absorbed), median_ms(expanded)
    pairs = num_seqs * (q_len * (context - q_len) + q_len * (q_len + 1) // 2)
    flops_a = 2 * HEADS * (LORA + ROPE + LORA) * pairs + 2 * rows * HEADS * LORA * (NOPE + V)
    flops_e = 2 * HEADS * (NOPE + ROPE + V) * pairs + 2 * num_seqs * context * LORA * HEADS * (NOPE + V)  # fmt: skip
    print(
        f"prefill {num_seqs} x {q_len} new of {context}: absorbed {ms_a:8.3f} ms "
        f"({flops_a / (ms_a * 1e-3) / 1e12:5.1f} TFLOP/s), expanded {ms_e:8.3f} ms "
        f"({flops_e / (ms_e * 1e-3) / 1e12:5.1f} TFLOP/s): x{ms_a / ms_e:4.1f}, diff {diff:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="try launch parameters")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--prefill-only", action="store_true", help="skip the decode runs")
    parser.add_argument(
        "--sweep-variants", action="store_true", help="only the decode launch configs table"
    )
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {copy_bw / 1e12:.2f} TB/s")
    if args.sweep_variants:
        sweep_variants(copy_bw)
        return
    if not args.prefill_only:
        decode(args.num_seqs, args.context, args.sweep, copy_bw)
        decode(32, 4096, False, copy_bw)
    prefill(1, 2048, 2048)  # one prompt
    prefill(1, 8192, 2048)  # a chunk after 6,144 cached tokens
    prefill(4, 4096, 4096)  # 16,384 prefill tokens in one step
    for q_len in (8, 16, 32, 64, 128, 256, 512):  # where expanding starts to pay
        prefill(8, 2048, q_len)


if __name__ == "__main__":
    main()
