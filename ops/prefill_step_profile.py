"""Where an 8B prefill step goes on the GPU (issue 9's 85% of the floor, issue 12's 1.5x): a
step of whole prompts filling the workload's 16,384-token budget, alone or beside `--beside`
running decodes as the 512 x (1,000 + 1,000) workload's prefill steps carry them (Llama-3.1-8B
shape, random bf16 weights). Prints each step's wall time, its linears' rate at that time and
the decodes' KV bytes, then one more step's kernels under torch.profiler.

    python -m troupe.ops.prefill_step_profile [--beside 256] [--prompt-len 1024]
        [--kv-cache-dtype fp8] [--steps 4]
"""

from __future__ import annotations

import argparse

import torch
from troupe.gpu.kv_cache import kv_dtype
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.pool_sizing import block_bytes
from troupe.ops.bench_offline import linear_params
from troupe.ops.mixed_step_bench import BLOCK, Driver

BUDGET = 16384  # the workload's max_num_batched_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", type=int, default=0, help="running decodes in each step")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4, help="timed steps before the profiled")
    parser.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    args = parser.parse_args()
    from troupe.ops.fp8_kv_bench import LLAMA_8B, random_model

    model = random_model()
    per_step = max(1, (BUDGET - args.beside) // args.prompt_len)
    steps = args.steps + 2  # a warm-up, the timed, the profiled
    prompt_blocks = -(-args.prompt_len // BLOCK)
    decode_blocks = -(-(args.prompt_len + steps + 1) // BLOCK)
    runner = ModelRunner(
        LLAMA_8B,
        model,
        RunnerOptions(
            block_size=BLOCK,
            num_gpu_blocks=args.beside * decode_blocks + steps * per_step * prompt_blocks,
            max_num_seqs=args.beside + per_step,
            max_model_len=4096,
            kv_cache_dtype=args.kv_cache_dtype,
        ),
    )
    driver = Driver(runner, args.beside, args.prompt_len)  # the decodes' prompts, untimed
    released: tuple[str, ...] = ()

    def step() -> float:
        """The decodes and per_step fresh prompts; the last step's prompts end here."""
        nonlocal released
        news = [driver.chunk(args.prompt_len) for _ in range(per_step)]
        seconds = driver.run(driver.decodes() + [work for work, _ in news], released)
        released = tuple(rid for _, rid in news)
        return seconds

    step()  # compiles what such a step launches
    flop_per_row = 2 * linear_params(LLAMA_8B)
    kv_per_token = block_bytes(LLAMA_8B, 1, kv_dtype(args.kv_cache_dtype, torch.bfloat16))
    for _ in range(args.steps):
        kv = sum(driver.pos[r] + 1 for r in driver.last) * kv_per_token
        seconds = step()
        rows = per_step * args.prompt_len + args.beside
        print(
            f"step of {per_step} x {args.prompt_len} prompt tokens + {args.beside} decodes: "
            f"{1000 * seconds:.1f} ms; linears {flop_per_row * rows / seconds / 1e12:.0f} "
            f"TFLOP/s if alone; decodes' KV {kv / 1e9:.1f} GB",
            flush=True,
        )
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        seconds = step()
    events = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    print(f"profiled step: {1000 * seconds:.1f} ms wall, {kernels / 1000:.1f} ms in kernels")
    print(events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
