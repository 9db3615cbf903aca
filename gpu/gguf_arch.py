"""What a GGUF file's architecture means in HF's terms: its config and its tensor names.

llama   metadata under "llama.*"; q/k rows permuted by llama.cpp (gguf_weights undoes it)
gemma3  metadata under "gemma3.*", read into an HF Gemma 3 text config; no permutation;
        every RMSNorm weight stored as 1 + w (llama.cpp adds the 1 that HF's Gemma norm
        applies at run time), so loading subtracts it. The file says nothing of the
        window pattern, query_pre_attn_scalar or the local RoPE base: HF's Gemma3TextConfig
        defaults apply (every 6th layer global, 256, 10,000), as in transformers' own loader.
gemma2  as gemma3, under "gemma2.*", without the q/k norms; the attention and final logit caps
        from attn_logit_softcapping / final_logit_softcapping (llama.cpp writes both; absent,
        HF's Gemma2Config defaults, 50 and 30, apply), every other layer local from layer 0
deepseek2  DeepSeek-V2 / V3 (MLA, MoE): metadata and the tensors that are not one to one
        (merged experts, kv_b split into k_b / v_b) in gpu/gguf_deepseek.py
qwen2, qwen3  metadata under "qwen2.*" / "qwen3.*", read into an HF config of that family; no
        permutation (llama.cpp's converter permutes the llama arch's q/k only); Qwen2's q/k/v
        biases (attn_q.bias ...), Qwen3's per-head q/k norms (attn_q_norm ...); head_dim from
        attention.key_length; YaRN from rope.scaling.type, factor, original_context_length
qwen3moe  Qwen3's attention and experts in every layer: ffn_gate_inp (the router) and the merged
        ffn_{gate,up,down}_exps (split per expert as DeepSeek's are, gpu/gguf_deepseek.py);
        expert_count, expert_used_count, expert_feed_forward_length; the top-k renormalised
        (llama.cpp's qwen3moe always does)
qwen2moe  Qwen2's attention (q/k/v biases) over experts in every layer, as qwen3moe's, and the
        shared expert (ffn_{gate,up,down}_shexp, expert_shared_feed_forward_length) with its
        gate (ffn_gate_inp_shexp, a vector: HF's [1, hidden]); the top-k not renormalised
        (Qwen2-MoE's norm_topk_prob is off)
starcoder2  StarCoder2: biased LayerNorms (attention.layer_norm_epsilon) and biases on every
        projection, the MLP without a gate (ffn_up / ffn_down: HF's c_fc / c_proj)
nemotron  Nemotron (Minitron): StarCoder2's layout under Llama's names, its LayerNorm1P weights
        stored with their 1 added (llama.cpp's converter adds it; loading takes it off, as for
        Gemma's norms), rotary over rope.dimension_count of each head (HF's default is half);
        the biases as the file has them (gguf_weights.read_gguf_config)
phi3    Phi-3 / Phi-3.5 / Phi-4-mini: q|k|v fused (attn_qkv) and gate|up fused (ffn_up, twice
        feed_forward_length rows), read as HF's fused names, which the loader splits; a window
        from attention.sliding_window; rotary over rope.dimension_count of each head (Phi-4-mini
        rotates 3/4); the long-context models' longrope factors are tensors
        (rope_factors_long / _short, read by gguf_weights.read_gguf_config)
"""

from __future__ import annotations

from typing import Any

from troupe.gpu.model_config import ModelLoadError

TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "output_norm.bias": "model.norm.bias",  # StarCoder2's
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
_GEMMA2_LAYER = {
    **_LLAMA_LAYER,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GEMMA3_LAYER = {
    **_GEMMA2_LAYER,
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
_QWEN2_LAYER = {
    **_LLAMA_LAYER,
    **{f"attn_{p}.bias": f"self_attn.{p}_proj.bias" for p in "qkv"},
}
_QWEN3_LAYER = {
    **_LLAMA_LAYER,
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_QWEN3MOE_LAYER = {**_QWEN3_LAYER, "ffn_gate_inp.weight": "mlp.gate.weight"}
_QWEN2MOE_LAYER = {
    **_QWEN2_LAYER,
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    **{
        f"ffn_{p}_shexp.weight": f"mlp.shared_expert.{p}_proj.weight"
        for p in ("gate", "up", "down")
    },
}
_PHI3_LAYER = {
    **_LLAMA_LAYER,
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",  # gate | up: no separate ffn_gate
}
_STARCODER2_LAYER = {
    **{f"attn_norm.{p}": f"input_layernorm.{p}" for p in ("weight", "bias")},
    **{f"ffn_norm.{p}": f"post_attention_layernorm.{p}" for p in ("weight", "bias")},
    **{
        f"attn_{g}.{p}": f"self_attn.{h}_proj.{p}"
        for g, h in zip(("q", "k", "v", "output"), "qkvo", strict=True)
        for p in ("weight", "bias")
    },
    **{f"ffn_up.{p}": f"mlp.c_fc.{p}" for p in ("weight", "bias")},
    **{f"ffn_down.{p}": f"mlp.c_proj.{p}" for p in ("weight", "bias")},
}
_NEMOTRON_LAYER = {
    **_STARCODER2_LAYER,
    **{f"ffn_up.{p}": f"mlp.up_proj.{p}" for p in ("weight", "bias")},
    **{f"ffn_down.{p}": f"mlp.down_proj.{p}" for p in ("weight", "bias")},
}
PER_LAYER = {
    "llama": _LLAMA_LAYER,
    "starcoder2": _STARCODER2_LAYER,
    "nemotron": _NEMOTRON_LAYER,
    "phi3": _PHI3_LAYER,
    "gemma2": _GEMMA2_LAYER,
    "gemma3": _GEMMA3_LAYER,
    "deepseek2": _DEEPSEEK2_LAYER,
    "qwen2": _QWEN2_LAYER,
    "qwen3": _QWEN3_LAYER,
    "qwen3moe": _QWEN3MOE_LAYER,
    "qwen2moe": _QWEN2MOE_LAYER,
}
# the archs read into an HF config dict by `hf_config` (their HF model_type)
HF_CONFIG_ARCHS = {
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "qwen2moe": "qwen2_moe",
    "phi3": "phi3",
    "starcoder2": "starcoder2",
    "nemotron": "nemotron",
}
MERGED_EXPERT_ARCHS = ("deepseek2", "qwen3moe", "qwen2moe")  # ffn_*_exps split per expert at load
_GEMMAS = ("gemma2", "gemma3")  # norms stored as 1 + w
_ONE_ADDED = (*_GEMMAS, "nemotron")  # norm weights stored with the 1 their norm adds
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
    """What to add to a tensor as stored to get HF's weight (Gemma's and Nemotron's norms:
    -1)."""
    return -1.0 if arch in _ONE_ADDED and name.endswith("norm.weight") else 0.0


def hf_config(fields: dict[str, Any], arch: str, *, has_output_weight: bool) -> dict[str, Any]:
    """An HF config.json dict of a Gemma 2, Gemma 3 text, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE,
    Phi-3, StarCoder2 or Nemotron model from GGUF metadata."""

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in fields:
            raise ModelLoadError(f"GGUF metadata is missing '{arch}.{key}'")
        return fields[f"{arch}.{key}"]

    gemma = arch in _GEMMAS
    num_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(need("attention.key_length") if gemma else fields.get(
        f"{arch}.attention.key_length", hidden // num_heads))  # fmt: skip
    if int(fields.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise ModelLoadError(f"GGUF {arch}: attention.value_length differs from key_length")
    cfg: dict[str, Any] = {
        "model_type": HF_CONFIG_ARCHS[arch],
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(fields.get(f"{arch}.attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "intermediate_size": int(need("feed_forward_length")),
        "vocab_size": len(fields.get("tokenizer.ggml.tokens", ())) or int(need("vocab_size")),
        "rms_norm_eps": float(fields.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(
            fields.get(
                f"{arch}.rope.freq_base",
                1e4 if arch in ("gemma2", "phi3", "starcoder2", "nemotron") else 1e6,
            )
        ),
        "max_position_embeddings": int(fields.get(f"{arch}.context_length", 32768)),
        "tie_word_embeddings": not has_output_weight,
        "torch_dtype": "float32",
    }
    window = fields.get(f"{arch}.attention.sliding_window")
    if window and (gemma or arch == "phi3"):
        cfg["sliding_window"] = int(window)
    rotary = fields.get(f"{arch}.rope.dimension_count")
    if (arch == "phi3" and rotary and int(rotary) != head_dim) or (arch == "nemotron" and rotary):
        cfg["partial_rotary_factor"] = int(rotary) / head_dim
    if arch == "phi3" and f"{arch}.rope.scaling.original_context_length" in fields:
        original = fields[f"{arch}.rope.scaling.original_context_length"]
        cfg["original_max_position_embeddings"] = int(original)
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if arch == "gemma2" and f"{arch}.{cap}" in fields:
            cfg[cap] = float(fields[f"{arch}.{cap}"])
    if fields.get(f"{arch}.rope.scaling.type") == "yarn":
        cfg["rope_scaling"] = {
            "rope_type": "yarn",
            "factor": float(need("rope.scaling.factor")),
            "original_max_position_embeddings": int(need("rope.scaling.original_context_length")),
        }
    if arch in ("qwen3moe", "qwen2moe"):
        cfg |= {
            "num_experts": int(need("expert_count")),
            "num_experts_per_tok": int(need("expert_used_count")),
            "moe_intermediate_size": int(need("expert_feed_forward_length")),
            "norm_topk_prob": arch == "qwen3moe",
        }
    if arch in ("starcoder2", "nemotron"):  # their LayerNorms' eps, under their own keys
        eps = float(fields.get(f"{arch}.attention.layer_norm_epsilon", 1e-5))
        cfg["norm_eps" if arch == "nemotron" else "norm_epsilon"] = eps
    if arch == "qwen2moe":
        shared = int(fields.get(f"{arch}.expert_shared_feed_forward_length", 0))
        cfg["shared_expert_intermediate_size"] = shared
    eos = fields.get("tokenizer.ggml.eos_token_id")
    if isinstance(eos, int):
        cfg["eos_token_id"] = eos
    return cfg
