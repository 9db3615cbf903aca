"""fp8 vs bf16 KV on the GPU: decode attention bandwidth, and a Llama-3.1-8B-shape workload.

    python -m troupe.ops.fp8_kv_bench attention          # decode kernel, bytes counted in fp8
    python -m troupe.ops.fp8_kv_bench attention --sweep-variants   # fp8 candidates checked, BEST
    python -m troupe.ops.fp8_kv_bench workload [--num-seqs 1024]

attention: Llama-3.1-8B heads (32 q, 8 kv, head_dim 128), block_size 16; achieved bandwidth
counts K and V once in the cache's own bytes (1 per element for fp8) plus q and out, against a
1 GiB device copy.

workload: random bf16 weights of the Llama-3.1-8B shape generated on the device (no files),
the KV pool sized from free memory in each KV dtype (fp8: twice the blocks), then N requests of
1,000 prompt and 1,000 output tokens (ignore_eos, greedy) through ModelRunner with
ops/kv_workload.py's loop, which admits while blocks last: output tokens/s for bf16 KV then fp8
KV in the same process. `--max-running N` caps the requests in flight; `--timed` adds the step
timeline's phases (prefill steps, decode steps by batch size, time outside the runner);
`--warm-up` runs the workload's step shapes once before the timed run (a runner built here
skips the engine's start-up profile, so its first prefill steps would pay Triton's compiles).
"""

from __future__ import annotations

import argparse
import gc
import math
from typing import Any

import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.model_runner import ModelRunner, RunnerOptions, kv_dtype
from troupe.gpu.models import DecoderModel
from troupe.gpu.pool_sizing import blocks_from_free_memory
from troupe.kernels.decode_attention import DecodeConfig, paged_decode_attention_triton
from troupe.kernels.paged_batch import PagedBatch
from troupe.ops.bench_timing import flushed_graph_ms, median_ms
from troupe.ops.card_rates import copy_bandwidth
from troupe.ops.fp8_variant_sweep import fp8_decode_batch, sweep_variants
from troupe.ops.kv_workload import run_workload, summary_lines

LENGTH = 1000  # the workload's prompt tokens a request, and its output tokens
LLAMA_8B = ModelConfig(
    model_type="llama", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
    head_dim=128, intermediate_size=14336, vocab_size=128256, rms_norm_eps=1e-5,
    rope_theta=500000.0, max_position_embeddings=8192, eos_token_ids=(128001,),
    torch_dtype=torch.bfloat16,
)  # fmt: skip


def attention(copy_bw: float, sweep: bool = False) -> None:
    """Each shape in bf16 and fp8 at the default launch; `sweep`: fp8 over launch parameters
    too (fp8 moves half the bytes per tile, so its best tile may be larger)."""
    for num_seqs, context in ((256, 1024), (64, 4096), (16, 16384)):
        batch, k8, v8, scales = fp8_decode_batch(num_seqs, context)
        tokens = int(batch.seq_lens.sum())
        fp8 = {"k_scale": scales, "v_scale": scales}
        variants: list[tuple[str, torch.Tensor, torch.Tensor, dict[str, Any]]] = [
            ("bf16", batch.k_cache, batch.v_cache, {}),
            ("fp8", k8, v8, fp8),
        ]
        if sweep:
            variants += [
                (f"fp8 bn={bn} warps={w} stages={st}", k8, v8, {**fp8, "config": DecodeConfig(bn, w, st)})
                for bn in (32, 64, 128, 256) for w in (4, 8) for st in (2, 3, 4)
            ]  # fmt: skip
        for name, k, v, extra in variants:

            def call(
                b: PagedBatch = batch,
                k: torch.Tensor = k,
                v: torch.Tensor = v,
                extra: dict[str, Any] = extra,
            ) -> torch.Tensor:
                return paged_decode_attention_triton(
                    b.q, k, v, b.block_tables, b.seq_lens, 1 / math.sqrt(128),
                    b.max_seq_len, **extra,
                )  # fmt: skip

            nbytes = 2 * tokens * 8 * 128 * k.element_size() + 4 * batch.q.numel()
            # eager (launched from Python) and replayed from a CUDA graph with L2 flushed before
            # each call, as the engine runs it (ops/kernel_bench.py says why both)
            shown = []
            for how, ms in (
                ("eager", median_ms(call)),
                ("graph, L2 flushed", flushed_graph_ms(call)),
                ("graph, L2 dirty", flushed_graph_ms(call, dirty=True)),
            ):
                bw = nbytes / (ms * 1e-3)
                shown.append(f"{how} {ms * 1e3:.1f} us, {bw / 1e12:.2f} TB/s, {bw / copy_bw:.0%}")
            print(f"decode {num_seqs}x{context} {name}: {'; '.join(shown)} of copy", flush=True)


def random_model() -> DecoderModel:
    model = DecoderModel(LLAMA_8B, torch.bfloat16, torch.device("cuda"), 8192)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, param in model.named_parameters():
        if name.endswith("norm") or name.endswith("layernorm"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def workload(
    model: DecoderModel,
    cache: str,
    num_seqs: int,
    batched: int,
    *,
    max_running: int | None = None,
    timed: bool = False,
    warm_up: bool = False,
) -> None:
    gc.collect()
    torch.cuda.empty_cache()
    dtype = kv_dtype(cache, torch.bfloat16)
    num_blocks = blocks_from_free_memory(
        LLAMA_8B, 16, dtype, torch.device("cuda"), 0.9, peak_activation_bytes=8 * 2**30
    )
    options = RunnerOptions(
        block_size=16, num_gpu_blocks=num_blocks, max_num_seqs=num_seqs, max_model_len=2048,
        enforce_eager=False, mixed_graph_tokens=min(batched, 8192), kv_cache_dtype=cache,
    )  # fmt: skip
    runner = ModelRunner(LLAMA_8B, model, options)
    if warm_up:  # the run's step shapes once, untimed: prompts at the budget, then mixed steps
        run_workload(
            runner, num_blocks=num_blocks, block_size=16, num_seqs=2 * (batched // LENGTH) + 1,
            prompt_len=LENGTH, output_len=2, budget=batched, max_running=max_running,
        )  # fmt: skip
    result = run_workload(
        runner, num_blocks=num_blocks, block_size=16, num_seqs=num_seqs, prompt_len=LENGTH,
        output_len=LENGTH, budget=batched, max_running=max_running, timed=timed,
    )  # fmt: skip
    torch.cuda.synchronize()
    total = result.output_tokens
    print(
        f"{cache} KV: {num_blocks} blocks ({num_blocks * 16} tokens), peak {result.peak_running} "
        f"running, {total} output tokens in {result.seconds:.1f} s = "
        f"{total / result.seconds:.0f} tok/s",
        flush=True,
    )
    for line in summary_lines(result):
        print(line, flush=True)
    runner.close()
    del runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("attention", "workload"))
    parser.add_argument("--num-seqs", type=int, default=1024)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument(
        "--max-running", type=int, default=None, help="workload: requests in flight"
    )
    parser.add_argument("--timed", action="store_true", help="workload: the step timeline's phases")
    parser.add_argument(
        "--warm-up", action="store_true",
        help="workload: run the step shapes once, untimed, first (Triton compiles at first use)",
    )  # fmt: skip
    parser.add_argument("--sweep", action="store_true", help="attention: fp8 launch parameters")
    parser.add_argument(
        "--sweep-variants", action="store_true",
        help="attention: the fp8 candidates (fp8_variant_sweep), checked, one table + BEST",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.what == "attention":
        if args.sweep_variants:
            sweep_variants(copy_bandwidth())
        else:
            attention(copy_bandwidth(), args.sweep)
        return
    model = random_model()
    for cache in ("auto", "fp8"):
        workload(
            model, cache, args.num_seqs, args.max_num_batched_tokens,
            max_running=args.max_running, timed=args.timed, warm_up=args.warm_up,
        )  # fmt: skip


if __name__ == "__main__":
    main()
