"""DeepSeek-V2 / V3 in GGUF as llama.cpp writes them (arch "deepseek2"): the HF config from the
metadata, and the tensors that do not map one to one onto HF's (gpu/gguf_arch.py maps the rest).

llama.cpp's convert_hf_to_gguf.py (DeepseekV2Model) writes, beside the common keys:

    deepseek2.attention.kv_lora_rank / q_lora_rank (absent: a plain q_proj)
    deepseek2.attention.key_length_mla = nope + rope, value_length_mla = v_head_dim; key_length
        and value_length then describe the latent MQA view (kv_lora_rank + rope, kv_lora_rank).
        Files from before the _mla keys carry the per-head dims in key_length / value_length.
    deepseek2.rope.dimension_count = qk_rope_head_dim; head_count_kv = 1
    deepseek2.leading_dense_block_count = first_k_dense_replace (every later layer is MoE)
    deepseek2.expert_count / expert_used_count / expert_shared_count / expert_feed_forward_length,
        expert_weights_scale (routed_scaling_factor), expert_weights_norm (norm_topk_prob),
        expert_gating_func (1 softmax: V2, 2 sigmoid: V3), expert_group_count / _used_count
    deepseek2.rope.scaling.{type, factor, original_context_length}, and
        rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim

Not in the file, so taken as DeepSeek's released configs have them: mscale = mscale_all_dim
(their ratio scales cos/sin; 1 then), beta_fast 32 / beta_slow 1 (transformers' defaults),
topk_method noaux_tc for sigmoid gating, else group_limited_greedy with more than one group
and greedy with one.

Tensors: the routed experts merged per layer, ffn_{gate,up,down}_exps [E, rows, cols], are
split back per expert. kv_b_proj is attn_kv_b in older files; newer writers split it per head
into attn_k_b [H, L, Dn] (W_uk transposed, for absorption) and attn_v_b [H, Dv, L], joined
back here as [H * (Dn + Dv), L]. The rope rows are stored unpermuted (llama.cpp's rope for
this arch is the interleaved one, as HF's V2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from troupe.gguf_file import TensorInfo
from troupe.gpu.model_config import ModelLoadError

_EXPERTS = {
    "ffn_gate_exps.weight": "gate_proj",
    "ffn_up_exps.weight": "up_proj",
    "ffn_down_exps.weight": "down_proj",
}
_SIGMOID = 2  # gguf.ExpertGatingFuncType.SIGMOID


def deepseek2_hf_config(fields: dict[str, Any], *, has_output_weight: bool) -> dict[str, Any]:
    """An HF config.json dict (deepseek_v2, or deepseek_v3 for sigmoid gating) from GGUF
    metadata; ModelLoadError naming a missing key."""
    a = "deepseek2."

    def need(key: str) -> Any:
        if a + key not in fields:
            raise ModelLoadError(f"GGUF metadata is missing '{a}{key}'")
        return fields[a + key]

    def get(key: str, default: Any) -> Any:
        return fields.get(a + key, default)

    rope = int(need("rope.dimension_count"))
    if a + "attention.key_length_mla" in fields:
        qk_head = int(need("attention.key_length_mla"))
        v_head = int(need("attention.value_length_mla"))
    else:  # before llama.cpp wrote the _mla keys: the per-head dims themselves
        qk_head, v_head = int(need("attention.key_length")), int(need("attention.value_length"))
    sigmoid = int(get("expert_gating_func", 1)) == _SIGMOID
    groups = int(get("expert_group_count", 1))
    method = "noaux_tc" if sigmoid else ("group_limited_greedy" if groups > 1 else "greedy")
    num_heads = int(need("attention.head_count"))
    q_lora = get("attention.q_lora_rank", None)
    cfg: dict[str, Any] = {
        "model_type": "deepseek_v3" if sigmoid else "deepseek_v2",
        "hidden_size": int(need("embedding_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "intermediate_size": int(need("feed_forward_length")),
        "vocab_size": int(get("vocab_size", 0)) or len(fields.get("tokenizer.ggml.tokens", ())),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "q_lora_rank": int(q_lora) if q_lora else None,
        "kv_lora_rank": int(need("attention.kv_lora_rank")),
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": qk_head - rope,
        "v_head_dim": v_head,
        "first_k_dense_replace": int(get("leading_dense_block_count", 0)),
        "moe_layer_freq": 1,
        "n_routed_experts": int(get("expert_count", 0)) or None,
        "n_shared_experts": int(get("expert_shared_count", 0)),
        "num_experts_per_tok": int(get("expert_used_count", 0)) or None,
        "moe_intermediate_size": int(get("expert_feed_forward_length", 0)),
        "routed_scaling_factor": float(get("expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(get("expert_weights_norm", False)),
        "n_group": groups,
        "topk_group": int(get("expert_group_used_count", 1)),
        "topk_method": method,
        "scoring_func": "sigmoid" if sigmoid else "softmax",
        "tie_word_embeddings": not has_output_weight,
        "torch_dtype": "float32",
    }
    if get("rope.scaling.type", "none") == "yarn":
        mscale = round(float(get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1, 6)
        cfg["rope_scaling"] = {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": float(need("rope.scaling.factor")),
            "original_max_position_embeddings": int(need("rope.scaling.original_context_length")),
            "mscale": mscale,
            "mscale_all_dim": mscale,
            "beta_fast": 32,
            "beta_slow": 1,
        }
    eos = fields.get("tokenizer.ggml.eos_token_id")
    if isinstance(eos, int):
        cfg["eos_token_id"] = eos
    return cfg


def split_merged_tensors(
    infos: list[TensorInfo], read: Callable[[TensorInfo], np.ndarray]
) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, fp32 array) of the merged experts (one per expert; Qwen3-MoE's too) and of
    kv_b_proj joined from attn_k_b and attn_v_b; `read` dequantizes one tensor."""
    by_name = {info.name: info for info in infos}
    for info in infos:
        if not info.name.startswith("blk."):
            continue
        _, index, rest = info.name.split(".", 2)
        prefix = f"model.layers.{index}."
        if rest in _EXPERTS:
            merged = read(info)
            for expert in range(merged.shape[0]):
                yield f"{prefix}mlp.experts.{expert}.{_EXPERTS[rest]}.weight", merged[expert]
        elif rest == "attn_k_b.weight":
            v_info = by_name.get(f"blk.{index}.attn_v_b.weight")
            if v_info is None:
                raise ModelLoadError(f"GGUF tensor {info.name!r} has no attn_v_b beside it")
            k_b, v_b = read(info), read(v_info)  # [H, L, Dn], [H, Dv, L]
            if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[1] != v_b.shape[2]:
                raise ModelLoadError(
                    f"GGUF layer {index}: attn_k_b {k_b.shape} and attn_v_b {v_b.shape} "
                    "are not [H, L, Dn] and [H, Dv, L]"
                )
            joined = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
            yield prefix + "self_attn.kv_b_proj.weight", joined.reshape(-1, k_b.shape[1])
