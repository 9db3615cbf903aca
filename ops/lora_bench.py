"""What LoRA adapters cost a batch: the same requests on an engine without adapters, then on
one with `--num-adapters` random adapters (rank `--rank`, every projection targeted), the
requests without an adapter, all on one adapter, and spread over all of them (max_loras slots,
then fewer slots than adapters, which the scheduler runs by turns).

    python -m troupe.ops.lora_bench                        # the default model on the CPU
    python -m troupe.ops.lora_bench --model PATH --device cuda --num-requests 256
    python -m troupe.ops.lora_bench --runner fake         # the actors alone (adapters unread)
    python -m troupe.ops.lora_bench --device cuda --lora-kernel masked punica   # both forms

Each scenario sends `--num-requests` requests at once (`--prompt-len` random ids, each a fresh
prompt, greedy, `--max-tokens` tokens, EOS ignored) `--repeats` times, after a warm-up; prints
the median wall time, output tokens per second and median TTFT per scenario, and its
throughput against the engine without adapters. `--lora-kernel` runs the scenarios with
adapters under each form named (EngineConfig.lora_kernel: masked, punica), one after another.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def write_adapters(model: str | None, folder: Path, count: int, rank: int) -> list[str]:
    """`count` random PEFT adapters of the model's shapes in `folder`: "name=path" entries."""
    import json

    import torch
    from safetensors.torch import save_file
    from troupe.config import resolve_model_path
    from troupe.gpu.lora_adapter import TARGET_MODULES, module_shapes
    from troupe.gpu.weights import read_config

    config = read_config(resolve_model_path(model))
    shapes = module_shapes(config)
    entries = []
    for index in range(count):
        generator = torch.Generator().manual_seed(index)
        tensors = {}
        for layer in range(config.num_layers):
            for module in TARGET_MODULES:
                out_features, in_features = shapes[module]
                block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                key = f"base_model.model.model.layers.{layer}.{block}.{module}"
                a = torch.randn(rank, in_features, generator=generator) / in_features**0.5
                b = torch.randn(out_features, rank, generator=generator) * 0.01
                tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
        path = folder / f"adapter{index}"
        path.mkdir(parents=True)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        settings = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "bias": "none"}
        (path / "adapter_config.json").write_text(json.dumps(settings))
        entries.append(f"adapter{index}={path}")
    return entries


def run(
    config: Any, adapters: list[str | None], args: argparse.Namespace
) -> list[tuple[float, float]]:
    """(seconds, median TTFT) per repeat of the requests, adapter i % len(adapters) each."""
    import anyio
    from troupe import Engine, SamplingParams
    from troupe.messages import Finished

    out: list[tuple[float, float]] = []

    async def main() -> None:
        async with Engine.open(config) as engine:
            vocab = engine.tokenizer.vocab_size
            serial = 0

            async def batch() -> tuple[float, float]:
                nonlocal serial
                ttfts: list[float] = []
                start = time.perf_counter()

                async def one(i: int) -> None:
                    nonlocal serial
                    serial += 1
                    prompt = [
                        (serial * 7919 + j * 104729) % (vocab - 10) + 5
                        for j in range(args.prompt_len)
                    ]
                    params = SamplingParams(
                        max_tokens=args.max_tokens,
                        temperature=0.0,
                        ignore_eos=True,
                        lora=adapters[i % len(adapters)],
                    )
                    first, last = None, None
                    async for event in engine.generate(prompt, params):
                        if first is None:
                            first = time.perf_counter() - start
                        last = event
                    if not isinstance(last, Finished) or last.usage.completion_tokens != (
                        args.max_tokens
                    ):
                        raise RuntimeError(f"{params.lora}: the request did not finish: {last}")
                    ttfts.append(first or 0.0)

                async with anyio.create_task_group() as tg:
                    for i in range(args.num_requests):
                        tg.start_soon(one, i)
                return time.perf_counter() - start, statistics.median(ttfts)

            await batch()  # warm-up
            for _ in range(args.repeats):
                out.append(await batch())

    anyio.run(main)
    return out


def main(argv: list[str] | None = None) -> int:
    from troupe import EngineConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runner", choices=("model", "fake"), default="model")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--lora-kernel", nargs="+", choices=("masked", "punica"), default=["masked"]
    )
    args = parser.parse_args(argv)
    base = EngineConfig(model=args.model, device=args.device, runner=args.runner)
    with tempfile.TemporaryDirectory() as tmp:
        entries = write_adapters(args.model, Path(tmp), args.num_adapters, args.rank)
        names: list[str | None] = [e.split("=", 1)[0] for e in entries]
        scenarios: list[tuple[str, Any, list[str | None]]] = [("no adapters loaded", base, [None])]
        for kernel in args.lora_kernel:
            lora = base.replace(
                lora_modules=tuple(entries),
                max_loras=args.num_adapters,
                max_lora_rank=args.rank,
                lora_kernel=kernel,
            )
            few = lora.replace(max_loras=max(1, args.num_adapters // 2))
            scenarios += [
                (f"[{kernel}] adapters loaded, none used", lora, [None]),
                (f"[{kernel}] one adapter", lora, names[:1]),
                (f"[{kernel}] {args.num_adapters} adapters", lora, names),
                (f"[{kernel}] {args.num_adapters} adapters, {few.max_loras} slots", few, names),
            ]
        tokens = args.num_requests * args.max_tokens
        reference = None
        for label, config, adapters in scenarios:
            results = run(config, adapters, args)
            seconds = statistics.median(t for t, _ in results)
            ttft = statistics.median(f for _, f in results)
            rate = tokens / seconds
            reference = reference or rate
            print(
                f"{label:42s} {seconds:7.2f} s  {rate:9.1f} tok/s  TTFT p50 {1e3 * ttft:7.1f} ms"
                f"  {rate / reference:5.2f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
