"""Where a decode step's time goes on the GPU: wall time per step vs CUDA kernel time, and the
top kernels, for the Qwen3-0.6B shape at 256 sequences (random bf16 weights), or the
Llama-3.1-8B shape of issues 9 and 12 (`--model llama-8b`, an fp8 cache with
`--kv-cache-dtype fp8`).

    python -m troupe.ops.gpu_step_profile [--num-seqs N] [--prompt-len N] [--eager] [--no-overlap]
    python -m troupe.ops.gpu_step_profile --model llama-8b --prompt-len 1024

Wall time per `ModelRunner.execute` (it ends with the copy of sampled ids to the host, so it
includes all GPU work) against the sum of kernel times from torch.profiler: if wall is much
larger, the step is CPU-bound (Python, launches, syncs); if close, the kernels are the cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import build_model, qwen3_0_6b_config, random_weights
from troupe.messages import StepPlan
from troupe.ops.profile_runner import Timers, drive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--num-decode", type=int, default=40)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--no-overlap", action="store_true", help="no overlap scheduling")
    parser.add_argument("--cprofile", action="store_true", help="CPU profile of the decode steps")
    parser.add_argument("--model", choices=("qwen3-0.6b", "llama-8b"), default="qwen3-0.6b")
    parser.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    args = parser.parse_args()
    device = torch.device("cuda")
    if args.model == "llama-8b":
        from troupe.ops.fp8_kv_bench import LLAMA_8B, random_model

        config, model = LLAMA_8B, random_model()
    else:
        config = qwen3_0_6b_config()
        weights = random_weights(config, torch.bfloat16, seed=0)
        model = build_model(config, weights.items(), torch.bfloat16, device, 4096)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    per_seq = -(-(args.prompt_len + args.num_decode + 8) // 16)
    runner = ModelRunner(
        config,
        model,
        RunnerOptions(
            num_gpu_blocks=args.num_seqs * per_seq,
            max_num_seqs=args.num_seqs,
            max_model_len=4096,
            enforce_eager=args.eager,
            overlap_schedule=not args.no_overlap,  # on, as an engine on CUDA runs it
            kv_cache_dtype=args.kv_cache_dtype,
        ),
    )
    release = StepPlan(step_id=-1, seqs=(), released=tuple(f"r{i}" for i in range(args.num_seqs)))
    drive(runner, args.num_seqs, 5, args.prompt_len, Timers())  # warm-up, graph capture
    runner.execute(release)
    steps = drive(runner, args.num_seqs, args.num_decode, args.prompt_len, Timers())
    runner.execute(release)
    ctx = args.prompt_len + args.num_decode / 2
    kv_unit = 1 if args.kv_cache_dtype == "fp8" else 2
    kv_bytes = args.num_seqs * ctx * config.num_layers * config.kv_values_per_token * kv_unit
    floor_ms = 1000 * (kv_bytes + weight_bytes) / 4.26e12
    print(
        f"decode {args.num_seqs} seqs, ctx ~{ctx:.0f}, graphs={not args.eager}, "
        f"overlap={not args.no_overlap}: "
        f"median {1000 * statistics.median(steps):.2f} ms/step, floor {floor_ms:.2f} ms"
    )
    if args.cprofile:
        import cProfile
        import pstats

        cpu = cProfile.Profile()
        timers = Timers()
        timers.active = False
        cpu.enable()
        drive(runner, args.num_seqs, args.num_decode, args.prompt_len, timers)
        cpu.disable()
        runner.execute(release)
        pstats.Stats(cpu).sort_stats("tottime").print_stats(30)
        pstats.Stats(cpu).sort_stats("cumtime").print_stats(25)
        return
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    marks: list[float] = []

    def start_profile() -> None:  # after the prefill step: decode steps only
        torch.cuda.synchronize()
        prof.start()
        marks.append(time.perf_counter())

    drive(runner, args.num_seqs, 6, args.prompt_len, Timers(), before_decode=start_profile)
    torch.cuda.synchronize()
    wall = time.perf_counter() - marks[0]
    prof.stop()
    runner.execute(release)
    events = prof.key_averages()
    cuda_total = sum(e.self_device_time_total for e in events) / 1000  # ms
    print(f"profiled 6 decode steps: wall {1000 * wall:.1f} ms, kernels {cuda_total:.1f} ms")
    print(events.table(sort_by="self_device_time_total", row_limit=18, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
