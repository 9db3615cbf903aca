"""Tensor-parallel offline throughput: the Llama-3.1-8B shape (random bf16 weights) at
tensor_parallel_size 1 and P, through troupe.Engine, against each one's physical floor.

    python -m troupe.ops.tp_bench --tp 1 2                  # 64 seqs, 1,000 prompt / 1,000 out
    python -m troupe.ops.tp_bench --tp 2 --num-layers 4     # a quick look
    python -m troupe.ops.tp_bench --smoke --tp 1 2          # a 2-layer model on the CPU (gloo)

Floor at P ranks: every decode step each GPU reads 1/P of the weights and of the KV at HBM
bandwidth, prefill FLOPs split P ways (ops/bench_offline.physical_floor_s divided by P); the
all-reduces are not in it, so the fraction reached shows what they and the rest cost.
Also prints first-token-ready time (start-up: spawn, shard load, pool sizing).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights
from troupe.ops.bench_offline import hf_shape, physical_floor_s


def llama_8b_config(num_layers: int = 32) -> ModelConfig:
    """The Llama-3.1-8B shape."""
    return ModelConfig(
        model_type="llama",
        hidden_size=4096,
        num_layers=num_layers,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        torch_dtype=torch.bfloat16,
    )


def smoke_config() -> ModelConfig:
    return ModelConfig(
        model_type="llama",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=1024,
        max_position_embeddings=4096,
    )


def write_folder(folder: Path, c: ModelConfig, dtype: torch.dtype) -> None:
    """config.json, random model.safetensors and a word-level tokenizer.json."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models

    cfg = {
        "model_type": "llama",
        **hf_shape(c),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(random_weights(c, dtype, seed=0), str(folder / "model.safetensors"))
    vocab = {f"t{i}": i for i in range(c.vocab_size)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))


def run(folder: Path, tp: int, args: argparse.Namespace) -> tuple[int, float, float]:
    """(output tokens, seconds, start-up seconds) of the workload at `tp` ranks."""
    import anyio
    from troupe import Engine, EngineConfig, SamplingParams

    config = EngineConfig(
        model=str(folder),
        device="cpu" if args.smoke else "cuda",
        tensor_parallel_size=tp,
        max_num_seqs=args.num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.prompt_len + args.output_len + 16,
        enforce_eager=args.enforce_eager,
    )
    prompts = [
        [(7 * i + 13 * j) % 10_000 for j in range(args.prompt_len)] for i in range(args.num_seqs)
    ]
    total = 0
    elapsed = startup = 0.0

    async def main() -> None:
        nonlocal total, elapsed, startup
        opened = time.perf_counter()
        async with Engine.open(config) as engine:
            startup = time.perf_counter() - opened

            async def one(prompt: list[int], n: int) -> None:
                nonlocal total
                params = SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True)
                async for event in engine.generate(prompt, params):
                    total += len(event.token_ids)

            await one([1, 2, 3], 4)  # warm-up
            total = 0
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for prompt in prompts:
                    tg.start_soon(one, prompt, args.output_len)
            elapsed = time.perf_counter() - start

    anyio.run(main)
    return total, elapsed, startup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-seqs", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=1000)
    parser.add_argument("--num-layers", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model on the CPU")
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_seqs, args.prompt_len, args.output_len = 4, 16, 8
    config = smoke_config() if args.smoke else llama_8b_config(args.num_layers)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    prompts = [[0] * args.prompt_len] * args.num_seqs
    floor_1 = physical_floor_s(config, prompts, [args.output_len] * args.num_seqs)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_folder(folder, config, dtype)
        for tp in args.tp:
            total, elapsed, startup = run(folder, tp, args)
            floor = floor_1 / tp
            print(
                f"tp={tp} layers={config.num_layers} seqs={args.num_seqs} "
                f"prompt={args.prompt_len} out={args.output_len}: {total} tokens in "
                f"{elapsed:.2f}s = {total / elapsed:,.0f} tok/s; start-up {startup:.1f}s; "
                f"floor {floor:.2f}s, reached {floor / elapsed:.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
