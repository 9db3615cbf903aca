"""Offline throughput of a DeepSeek-V2-Lite-shaped model (random bf16 weights) on the nano-vllm
workload, against its physical floor computed as for dense models (ops/bench_offline.py).

    python -m troupe.ops.deepseek_offline [--mode runner] [--layers 27] [--smoke]
        [--mla-expand-min-tokens 128]   (0: every prefill row in the absorbed form)

Shape: 27 layers (the first dense), hidden 2048, 16 heads, MLA kv_lora_rank 512 + rope 64
(no q LoRA), 64 routed experts (moe_intermediate 1408) + 2 shared, top-6, vocab 102,400.
Weights are drawn on the GPU when there is one and written as one safetensors shard per layer.

Floor: each decode step reads the non-expert weights, the experts that the running batch is
expected to touch (E * (1 - (1 - k/E)^n) per sparse layer for n running sequences) and each
sequence's latent cache (kv_values_per_token); prefill costs 2 FLOPs per active parameter per
token plus causal attention in the expanded form (H * (Dqk + Dv) per query-key pair).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from troupe.gpu.deepseek_weights import deepseek_layer_weights
from troupe.gpu.model_config import ModelConfig
from troupe.ops.bench_offline import BF16_FLOPS, HBM_BYTES_PER_S, run_engine, run_runner, workload

V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1,
    "topk_group": 1, "topk_method": "greedy", "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "routed_scaling_factor": 1.0, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "max_position_embeddings": 163840, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "bos_token_id": 0, "eos_token_id": 1,
}  # fmt: skip


def write_folder(folder: Path, cfg: dict[str, object], device: torch.device) -> ModelConfig:
    """config.json, a word-level tokenizer and one random bf16 shard per layer."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models

    (folder / "config.json").write_text(json.dumps(cfg))
    config = ModelConfig.from_hf_folder(folder)
    gen = torch.Generator(device=device).manual_seed(0)

    def matrix(*shape: int) -> torch.Tensor:
        std = 0.02 if len(shape) == 1 else shape[-1] ** -0.5
        return (torch.randn(*shape, generator=gen, device=device) * std).bfloat16().cpu()

    def norm(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.bfloat16)

    h, v = config.hidden_size, config.vocab_size
    shards = {"model.embed_tokens.weight": matrix(v, h), "model.norm.weight": norm(h),
              "lm_head.weight": matrix(v, h)}  # fmt: skip
    weight_map = dict.fromkeys(shards, "top.safetensors")
    save_file(shards, str(folder / "top.safetensors"))
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        tensors = {
            p + "input_layernorm.weight": norm(h),
            p + "post_attention_layernorm.weight": norm(h),
        }
        tensors.update(deepseek_layer_weights(config, layer, matrix, norm))
        name = f"layer{layer:03d}.safetensors"
        save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    vocab = {f"t{i}": i for i in range(v)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))
    return config


def physical_floor_s(config: ModelConfig, prompts: list[list[int]], outputs: list[int]) -> float:
    """The floor of the module docstring, in seconds."""
    c, m, moe = config, config.mla, config.moe
    assert m is not None and moe is not None
    h, heads = c.hidden_size, m.num_heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    attention = heads * qk * h + m.latent_size * h + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim) + h * heads * m.v_head_dim  # fmt: skip
    expert = 3 * h * moe.intermediate_size
    num_sparse = sum(moe.sparse_layers)
    num_dense = c.num_layers - num_sparse
    fixed = (
        c.num_layers * attention
        + num_dense * 3 * h * c.intermediate_size
        + num_sparse * (moe.num_shared_experts * expert + moe.num_experts * h)
        + c.vocab_size * h  # lm_head (the embedding is a gather)
    )
    kv_per_token = c.num_layers * c.kv_values_per_token * 2
    byte_s = 0.0
    for step in range(max(outputs)):
        running = [i for i, o in enumerate(outputs) if o > step]
        touched = moe.num_experts * (1 - (1 - moe.top_k / moe.num_experts) ** len(running))
        context = sum(len(prompts[i]) + step for i in running)
        byte_s += 2 * (fixed + num_sparse * touched * expert) + context * kv_per_token
    active = fixed + num_sparse * moe.top_k * expert
    prefill_tokens = sum(len(p) for p in prompts)
    attn_flops = sum(c.num_layers * len(p) ** 2 * heads * (qk + m.v_head_dim) for p in prompts)
    return byte_s / HBM_BYTES_PER_S + (2 * active * prefill_tokens + attn_flops) / BF16_FLOPS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("engine", "runner"), default="engine")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--layers", type=int, default=27, help="fewer layers: a quicker run")
    parser.add_argument("--smoke", action="store_true", help="tiny dims: a CPU smoke run")
    parser.add_argument(
        "--mla-expand-min-tokens",
        type=int,
        default=128,
        help="steps with a prefill chunk this long expand the latent (0: absorbed everywhere)",
    )
    args = parser.parse_args(argv)
    cfg = {**V2_LITE, "num_hidden_layers": args.layers}
    if args.smoke:
        cfg |= {"hidden_size": 64, "num_attention_heads": 4, "kv_lora_rank": 32,
                "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8,
                "num_experts_per_tok": 2, "vocab_size": 10_240}  # fmt: skip
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prompts, outputs = workload(args.num_seqs, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_folder(folder, cfg, device)
        fn: Callable[..., int] = run_engine if args.mode == "engine" else run_runner
        total = fn(folder, prompts, outputs, args, mla_expand_min_tokens=args.mla_expand_min_tokens)
        elapsed = fn.elapsed  # type: ignore[attr-defined]
    floor = physical_floor_s(config, prompts, outputs)
    print(f"deepseek_v2 ({config.num_layers} layers) mode={args.mode} seqs={args.num_seqs} "
          f"mla_expand_min_tokens={args.mla_expand_min_tokens} "
          f"output tokens={total} time={elapsed:.2f}s: {total / elapsed:,.0f} output tok/s")  # fmt: skip
    print(f"physical floor: {floor:.2f}s; reached {floor / elapsed:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
