"""StreamingLLM on SmolLM2 (CPU): one greedy generation far past max_model_len, its KV bounded by
sinks + window, its logits checked against the plain torch reference (gpu/streaming_reference.py)
at chosen steps.

    python -m troupe.ops.streaming_bench --tokens 3000 --max-model-len 512 --window 252
    python -m troupe.ops.streaming_bench --tokens 20000 --max-model-len 2048 --window 1020

The scheduler, the allocator and the real model runner are wired synchronously
(ops.bench_scheduler.CoreLoop, the same cores the engine runs); the pool holds max_model_len
tokens of blocks, so the request's whole KV could never fit. After every allocator batch the
blocks held (used, minus cached-free) are counted. The reference then decodes the same token
sequence one token at a time (keys before rotary, re-rotated at cache positions each step) and
its logits are compared with the engine's at --checks steps spread over the run (the first
steps after the window starts to slide among them). The reference multiplies through the
model's own weights (quant_linear.linear), so only attention and positions are its own;
weights are dequantized to fp32 unless --quantization auto.

Prints one JSON line: tokens, seconds, tokens/s, peak_blocks_held, bound (StepLimits
.peak_blocks), pool, held_at_end, max_abs_logit_diff, max_logit, argmax_agree, steps checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.runner_setup import load_for_config
from troupe.gpu.streaming_reference import StreamingReference
from troupe.messages import AdmittedRequest, SamplingParams
from troupe.ops.bench_scheduler import CoreLoop

PROMPT = [1, 9690, 28, 253, 2365, 11, 5248, 314, 253, 1789, 30, 2, 198, 1, 4093, 198]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=3000, help="tokens to generate")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--window", type=int, default=252)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens")
    ap.add_argument("--checks", type=int, default=8, help="steps whose logits are compared")
    ap.add_argument(
        "--progress", type=int, default=1000, help="print steps done and seconds to stderr "
        "every this many steps (0: never)",
    )  # fmt: skip
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (GGUF)")
    ap.add_argument(
        "--quantization", default="dequantize", choices=("auto", "dequantize"),
        help="dequantize: fp32 weights (what the check needs); auto: the CPU default, int4 "
        "kept, whose packed kernels round a prompt's rows otherwise than the reference's "
        "one row at a time, so the logits drift (0.68 max abs at 100 tokens)",
    )  # fmt: skip
    args = ap.parse_args()
    bs, total = args.block_size, len(PROMPT) + args.tokens
    num_blocks = args.max_model_len // bs
    config = EngineConfig(
        model=args.model, device="cpu", max_model_len=args.max_model_len, block_size=bs,
        num_kv_blocks=num_blocks, num_cpu_blocks=0, max_num_batched_tokens=args.chunk,
        max_num_seqs=1, quantization=args.quantization, streaming_max_len=total,
    )  # fmt: skip
    loaded = load_for_config(config)
    slide = args.sinks + args.window - len(PROMPT)  # first step whose cache evicts
    steps = {round(i * (args.tokens - 1) / max(1, args.checks - 1)) for i in range(args.checks)}
    steps |= {s for s in (slide - 1, slide, slide + 1) if 0 <= s < args.tokens}
    captured: dict[int, torch.Tensor] = {}
    num_steps = [0]

    def hook(request_ids: object, logits: torch.Tensor) -> None:
        if num_steps[0] in steps:
            captured[num_steps[0]] = logits[0].clone()
        num_steps[0] += 1
        if args.progress and num_steps[0] % args.progress == 0:
            print(f"engine: {num_steps[0]} steps, {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip

    runner = ModelRunner(loaded.config, loaded.model, loaded.options, logits_hook=hook)
    scheduler = SchedulerCore(StepLimits(block_size=bs, num_gpu_blocks=num_blocks, max_num_seqs=1, max_num_batched_tokens=args.chunk), num_cpu_blocks=0, eos_token_ids=())  # fmt: skip
    allocator = AllocatorCore(block_size=bs, num_gpu_blocks=num_blocks, num_cpu_blocks=0)
    held: list[int] = []

    def count(alloc: AllocatorCore) -> None:
        held.append(alloc.gpu.num_blocks - alloc.gpu.num_free)  # num_free counts cached-free

    loop = CoreLoop(scheduler, allocator, runner, check=count)  # type: ignore[arg-type]
    params = SamplingParams(
        max_tokens=args.tokens, temperature=0.0, ignore_eos=True,
        streaming_window=args.window, sink_tokens=args.sinks,
    )  # fmt: skip
    request = AdmittedRequest(
        request_id="stream", prompt_token_ids=tuple(PROMPT), params=params, arrival_time=0.0,
        max_total_tokens=total,
    )  # fmt: skip
    t0 = time.perf_counter()
    loop.submit([request])
    loop.run()
    seconds = time.perf_counter() - t0
    tokens = PROMPT + loop.tokens["stream"]
    assert len(tokens) == total, (len(tokens), total)
    bound = scheduler.limits.peak_blocks(total, args.window, args.sinks)
    reference = StreamingReference(loaded.model, sink_tokens=args.sinks, window=args.window)
    diffs, agree, top = [], 0, 0.0
    t1 = time.perf_counter()
    for i, token in enumerate(tokens[: len(PROMPT) + max(steps)]):
        logits = reference.step(token)
        if args.progress and (i + 1) % args.progress == 0:
            print(f"reference: {i + 1} tokens, {time.perf_counter() - t1:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
        step = i - (len(PROMPT) - 1)
        if step in captured:
            diffs.append(float((captured[step] - logits).abs().max()))
            agree += int(captured[step].argmax() == logits.argmax())
            top = max(top, float(logits.abs().max()))
    report = {
        "tokens": args.tokens,
        "prompt": len(PROMPT),
        "max_model_len": args.max_model_len,
        "sinks": args.sinks,
        "window": args.window,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(args.tokens / seconds, 2),
        "pool_blocks": num_blocks,
        "request_blocks": -(-total // bs),
        "peak_blocks_held": max(held),
        "bound": bound,
        "held_at_end": held[-1],
        "steps_checked": sorted(captured),
        "max_abs_logit_diff": max(diffs),
        "max_abs_logit": round(top, 2),
        "argmax_agree": f"{agree}/{len(captured)}",
        "reference_seconds": round(time.perf_counter() - t1, 1),
    }
    print(json.dumps(report))
    assert max(held) <= bound and held[-1] == 0


if __name__ == "__main__":
    main()
