"""One LoRA-wrapped projection's time per form (gpu/lora_linear.py): off (the base alone),
masked (all max_loras slots, masked) and punica (each token through its own adapter:
kernels/lora_shrink.py, lora_expand.py), on CUDA in bf16, for decode- and prefill-shaped steps.

    python -m troupe.ops.lora_kernel_bench                     # Llama-3-8B's q/k/v, gate/up, down
    python -m troupe.ops.lora_kernel_bench --tokens 1 64 256 --max-loras 8 --rank 16

Each step's tokens take the slots in turn (token t: slot t % max_loras; `--no-adapter-share`
of them none). A step of `--graph-max` tokens or fewer is timed as a CUDA graph replay (as
the engine's decode and mixed-step graphs run it), a longer one eagerly; CUDA events, median
of `--repeats` after a warm-up. Prints microseconds per call, each form against off, and the
largest difference between the punica and masked outputs (bf16: both round).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import numpy as np
import torch
from troupe.config import LoraKernel
from troupe.gpu.lora_linear import LoraLinear, LoraSlots

# (name, in_features, fused slices): Llama-3-8B's projections
PROJECTIONS = (
    ("qkv", 4096, (4096, 1024, 1024)),
    ("gate_up", 4096, (14336, 14336)),
    ("down", 14336, (4096,)),
)


def _projection(
    kernel: LoraKernel, in_features: int, slices: tuple[int, ...], args: argparse.Namespace
) -> LoraLinear:
    device = torch.device("cuda")
    max_tokens = max(args.tokens)
    slots = LoraSlots(args.max_loras, args.rank, max_tokens, torch.bfloat16, device, kernel)
    g = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(sum(slices), in_features, generator=g, device=device) / in_features**0.5
    proj = LoraLinear(weight.to(torch.bfloat16), slices, in_features, slots)
    for slot in range(args.max_loras):
        for index, size in enumerate(slices):
            a = torch.randn(args.rank, in_features, generator=g, device=device) / in_features**0.5
            b = torch.randn(size, args.rank, generator=g, device=device) * 0.1
            proj.load(slot, index, a, b)
    return proj


def _timed(call: Callable[[], object], repeats: int) -> float:
    """Median microseconds of `call` (already warm)."""
    times: list[float] = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(1e3 * float(start.elapsed_time(end)))
    return statistics.median(times)


def _run(
    proj: LoraLinear, x: torch.Tensor, active: bool, args: argparse.Namespace
) -> tuple[float, torch.Tensor]:
    """(microseconds per call, the output) of the projection in its form on x."""
    slots, num_tokens = proj.slots, x.shape[0]
    token_slots = np.arange(num_tokens) % args.max_loras
    token_slots[: int(num_tokens * args.no_adapter_share)] = -1
    slots.is_active, slots.only_slot = active, None
    slots.write(token_slots)

    def forward() -> torch.Tensor:
        slots.begin(num_tokens)
        return proj(x)

    for _ in range(3):
        out = forward()  # compile and warm up
    torch.cuda.synchronize()
    if num_tokens > args.graph_max:
        return _timed(forward, args.repeats), forward()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward()
    return _timed(graph.replay, args.repeats), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 256, 2048, 8192])
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--no-adapter-share", type=float, default=0.0)
    parser.add_argument("--graph-max", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("lora_kernel_bench needs a CUDA device")
    print(f"{'projection':10s} {'tokens':>6s} {'off us':>9s} {'masked us':>10s} {'punica us':>10s}"
          f" {'masked x':>9s} {'punica x':>9s} {'max |p - m|':>12s}")  # fmt: skip
    for name, in_features, slices in PROJECTIONS:
        forms = {
            kernel: _projection(kernel, in_features, slices, args)
            for kernel in ("masked", "punica")
        }
        for num_tokens in args.tokens:
            g = torch.Generator(device="cuda").manual_seed(num_tokens)
            x = torch.randn(num_tokens, in_features, generator=g, device="cuda").to(torch.bfloat16)
            off, _ = _run(forms["masked"], x, False, args)
            masked, masked_out = _run(forms["masked"], x, True, args)
            punica, punica_out = _run(forms["punica"], x, True, args)
            diff = (punica_out.float() - masked_out.float()).abs().max().item()
            print(f"{name:10s} {num_tokens:6d} {off:9.1f} {masked:10.1f} {punica:10.1f}"
                  f" {masked / off:9.2f} {punica / off:9.2f} {diff:12.4f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
