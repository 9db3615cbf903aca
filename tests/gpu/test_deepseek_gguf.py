"""DeepSeek-V2 (and V3) from a GGUF file (arch "deepseek2", gpu/gguf_deepseek.py), written as
llama.cpp's convert_hf_to_gguf.py writes one: the routed experts merged per layer, kv_b_proj
either split per head into attn_k_b (transposed) and attn_v_b with the *_length_mla keys (newer
writers) or whole as attn_kv_b with per-head key/value lengths (older ones), YaRN as
rope.scaling.yarn_log_multiplier, Q8_0 / F16 / F32 tensors; V3 adds the q LoRA, sigmoid gating
and exp_probs_b. transformers cannot read this arch, so its reference loads an HF folder
holding the very values the file stores (dequantized): greedy tokens must be identical (fp32,
CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

HF = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": None,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 96,
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 2,
    "topk_method": "group_limited_greedy",
    "routed_scaling_factor": 1.5,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
    "rope_scaling": {  # GGUF keeps mscale_all_dim only: mscale equal, as DeepSeek ships
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "mscale": 0.75,
        "mscale_all_dim": 0.75,
        "beta_fast": 32,
        "beta_slow": 1,
    },
}
V3 = {"q_lora_rank": 24, "norm_topk_prob": True, "topk_method": "noaux_tc"}
Q8 = gguf.GGMLQuantizationType.Q8_0
LAYER = {  # HF name under model.layers.N. -> llama.cpp's (experts and kv_b: below)
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 10


def _stored_as(hf_name: str) -> Any:
    """The GGUF type of an HF tensor: Q8_0 for projections and experts, F32 for norms and
    the router (as llama.cpp keeps 1-D and gate_inp tensors), F16 for the rest."""
    if hf_name.endswith(("norm.weight", "mlp.gate.weight", "correction_bias")):
        return gguf.GGMLQuantizationType.F32
    if any(k in hf_name for k in ("q_proj", "kv_a_proj", "mlp.experts.")):
        return Q8
    return gguf.GGMLQuantizationType.F16


def _round(data: np.ndarray, qtype: Any) -> np.ndarray:
    """What the file gives back: the values dequantized."""
    if qtype == Q8:
        return gguf.quants.dequantize(gguf.quants.quantize(data, Q8), Q8).astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16).astype(np.float32)
    return data


def _add(writer: Any, name: str, data: np.ndarray, qtype: Any) -> None:
    if qtype == Q8:
        writer.add_tensor(name, gguf.quants.quantize(data, Q8), raw_dtype=Q8)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        writer.add_tensor(name, data.astype(np.float32))


def _write_gguf(path: Path, weights: dict[str, np.ndarray], c: dict[str, Any], split_kv_b: bool) -> None:  # fmt: skip
    """As convert_hf_to_gguf.py's DeepseekV2Model writes a DeepSeek-V2 / V3 checkpoint."""
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(1)  # MLA written as MQA
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_group_count(c["n_group"])
    w.add_expert_group_used_count(c["topk_group"])
    v3 = c["topk_method"] == "noaux_tc"
    sigmoid = gguf.ExpertGatingFuncType.SIGMOID
    w.add_expert_gating_func(sigmoid if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    if v3:
        w.add_q_lora_rank(c["q_lora_rank"])
        w.add_expert_weights_norm(True)
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_vocab_size(c["vocab_size"])
    w.add_kv_lora_rank(c["kv_lora_rank"])
    rope, nope, v = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
    if split_kv_b:
        w.add_key_length(c["kv_lora_rank"] + rope)
        w.add_value_length(c["kv_lora_rank"])
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
    else:  # the writers before MLA absorption: per-head lengths
        w.add_key_length(nope + rope)
        w.add_value_length(v)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_rope_dimension_count(rope)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(c["rope_scaling"]["factor"])
    w.add_rope_scaling_orig_ctx_len(c["rope_scaling"]["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_log_mul(0.1 * c["rope_scaling"]["mscale_all_dim"])
    w.add_eos_token_id(1)
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for hf, name in top.items():
        _add(w, name, weights[hf], _stored_as(hf))
    heads, experts = c["num_attention_heads"], c["n_routed_experts"]
    for layer in range(c["num_hidden_layers"]):
        p, b = f"model.layers.{layer}.", f"blk.{layer}."
        for hf, name in LAYER.items():
            if p + hf in weights:
                _add(w, b + name, weights[p + hf], _stored_as(p + hf))
        if p + "mlp.experts.0.gate_proj.weight" in weights:
            for proj, name in (("gate", "ffn_gate_exps"), ("up", "ffn_up_exps"), ("down", "ffn_down_exps")):  # fmt: skip
                merged = [weights[f"{p}mlp.experts.{e}.{proj}_proj.weight"] for e in range(experts)]
                _add(w, f"{b}{name}.weight", np.stack(merged), Q8)
        kv_b = weights[p + "self_attn.kv_b_proj.weight"]
        if split_kv_b:
            per_head = kv_b.reshape(heads, nope + v, -1)
            k_b = np.ascontiguousarray(per_head[:, :nope].transpose(0, 2, 1))
            _add(w, b + "attn_k_b.weight", k_b, gguf.GGMLQuantizationType.F16)
            _add(w, b + "attn_v_b.weight", np.ascontiguousarray(per_head[:, nope:]), gguf.GGMLQuantizationType.F16)  # fmt: skip
        else:
            _add(w, b + "attn_kv_b.weight", kv_b, gguf.GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(
    scope="module", params=[("v2", True), ("v2", False), ("v3", True)], ids=["v2", "v2_kv_b", "v3"]
)
def deepseek_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(GGUF path, HF folder, transformers' model over the values the file stores) for a
    variant and a writer (kv_b split into k_b / v_b, or whole)."""
    from safetensors.torch import save_file

    variant, split = request.param
    folder = tmp_path_factory.mktemp(f"deepseek_gguf_{variant}")
    cfg = {**HF, **V3} if variant == "v3" else HF
    prefix = "DeepseekV3" if variant == "v3" else "DeepseekV2"
    getattr(transformers, f"{prefix}Config")(**cfg).save_pretrained(folder)
    ours = ModelConfig.from_hf_folder(folder)
    weights = {
        k: t.numpy() for k, t in random_weights(ours, torch.float32, seed=5, std=0.2).items()
    }
    path = folder / f"tiny-deepseek2-{variant}-{'split' if split else 'kv_b'}.gguf"
    _write_gguf(path, weights, cfg, split)
    stored = {k: torch.from_numpy(_round(t, _stored_as(k))) for k, t in weights.items()}
    save_file(stored, folder / "model.safetensors")
    model = getattr(transformers, f"{prefix}ForCausalLM").from_pretrained(
        folder, dtype=torch.float32
    )
    return path, folder, model.eval()


def test_config_from_metadata_equals_the_hf_one(deepseek_gguf: Any) -> None:
    from troupe.gpu.gguf_weights import read_gguf_config

    path, folder, _ = deepseek_gguf
    expected = ModelConfig.from_hf_folder(folder)
    config = read_gguf_config(path)
    assert config.model_type == expected.model_type
    assert config.mla == expected.mla and config.moe == expected.moe
    assert config.mla is not None and config.mla.rope_scaling is not None
    assert config.mla.softmax_scale == pytest.approx(expected.mla.softmax_scale, rel=1e-6)
    assert (config.num_layers, config.vocab_size, config.tie_word_embeddings) == (2, 256, False)


def test_greedy_equals_transformers(deepseek_gguf: Any, mt: Any) -> None:
    path, _, hf_model = deepseek_gguf
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(path, max_model_len=128), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token
