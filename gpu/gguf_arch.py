"""What a GGUF file's architecture means in HF's terms: its config and its tensor names.

llama   metadata under "llama.*"; q/k rows permuted by llama.cpp (gguf_weights undoes it)
gemma3  metadata under "gemma3.*", read into an HF Gemma 3 text config; no permutation;
        every RMSNorm weight stored as 1 + w (llama.cpp adds the 1 that HF's Gemma norm
        applies at run time), so loading subtracts it. The file says nothing of the
        window pattern, query_pre_attn_scalar or the local RoPE base: HF's Gemma3TextConfig
        defaults apply (every 6th layer global, 256, 10,000), as in transformers' own loader.
deepseek2  DeepSeek-V2 / V3 (MLA, MoE): metadata and the tensors that are not one to one
        (merged experts, kv_b split into k_b / v_b) in gpu/gguf_deepseek.py
"""

from __future__ import annotations

from typing import Any

from troupe.gpu.model_config import ModelLoadError

TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LLAMA_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GEMMA3_LAYER = {
    **_LLAMA_LAYER,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_DEEPSEEK2_LAYER = {  # the merged experts and attn_k_b / attn_v_b: gpu/gguf_deepseek.py
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",  # older writers
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
PER_LAYER = {"llama": _LLAMA_LAYER, "gemma3": _GEMMA3_LAYER, "deepseek2": _DEEPSEEK2_LAYER}
ARCHITECTURES = tuple(PER_LAYER)


def hf_name(name: str, arch: str) -> str | None:
    """The HF name of a GGUF tensor; None for tensors the model does not load."""
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    if name.startswith("blk."):
        _, index, rest = name.split(".", 2)
        per_layer = PER_LAYER[arch]
        if rest in per_layer:
            return f"model.layers.{index}.{per_layer[rest]}"
    return None  # e.g. rope_freqs: recomputed from the metadata


def norm_offset(name: str, arch: str) -> float:
    """What to add to a tensor as stored to get HF's weight (Gemma's norms: -1)."""
    return -1.0 if arch == "gemma3" and name.endswith("norm.weight") else 0.0


def gemma3_hf_config(fields: dict[str, Any], *, has_output_weight: bool) -> dict[str, Any]:
    """An HF config.json dict of a Gemma 3 text model from GGUF metadata."""

    def need(key: str) -> Any:
        if f"gemma3.{key}" not in fields:
            raise ModelLoadError(f"GGUF metadata is missing 'gemma3.{key}'")
        return fields[f"gemma3.{key}"]

    head_dim = int(need("attention.key_length"))
    if int(fields.get("gemma3.attention.value_length", head_dim)) != head_dim:
        raise ModelLoadError("GGUF gemma3: attention.value_length differs from key_length")
    num_heads = int(need("attention.head_count"))
    cfg: dict[str, Any] = {
        "model_type": "gemma3_text",
        "hidden_size": int(need("embedding_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(fields.get("gemma3.attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "intermediate_size": int(need("feed_forward_length")),
        "vocab_size": len(fields.get("tokenizer.ggml.tokens", ())) or int(need("vocab_size")),
        "rms_norm_eps": float(fields.get("gemma3.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(fields.get("gemma3.rope.freq_base", 1_000_000.0)),
        "max_position_embeddings": int(fields.get("gemma3.context_length", 32768)),
        "tie_word_embeddings": not has_output_weight,
        "torch_dtype": "float32",
    }
    window = fields.get("gemma3.attention.sliding_window")
    if window:
        cfg["sliding_window"] = int(window)
    eos = fields.get("tokenizer.ggml.eos_token_id")
    if isinstance(eos, int):
        cfg["eos_token_id"] = eos
    return cfg
