"""Qwen2, Qwen3, Qwen2-MoE and Qwen3-MoE from a GGUF file (archs "qwen2" / "qwen3" /
"qwen2moe" / "qwen3moe", gpu/gguf_arch.py), written as llama.cpp's convert_hf_to_gguf.py writes
one: q/k rows not permuted, Qwen2's q/k/v biases and Qwen3's q/k norms as F32, projections
Q8_0, embeddings F16, the MoEs' experts merged per layer (ffn_*_exps [E, rows, cols]) beside
their router, Qwen2-MoE's shared expert (ffn_*_shexp) and its gate (a vector).
transformers reads the same file (`gguf_file=`) as the reference: greedy tokens identical (fp32,
CPU, the weights dequantized as transformers dequantizes them), the config read from the
metadata equal to the HF one; the Q8_0 projections also load kept as shipped (int8 rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from troupe.gpu.model_config import ModelConfig

from tests.gpu.family_checks import TINY as FAMILY_TINY
from tests.gpu.family_checks import saved_family

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

Q8 = gguf.GGMLQuantizationType.Q8_0
F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 10
TINY = {**FAMILY_TINY, "rms_norm_eps": 1e-6, "rope_theta": 1000.0, "tie_word_embeddings": False}
FAMILIES = {
    "qwen2": ("Qwen2", {}),
    # heads wider than hidden / heads (written as attention.key_length); 128 because
    # transformers' GGUF reader leaves Qwen3's head_dim at its default
    "qwen3": ("Qwen3", {"head_dim": 128}),
    # transformers' GGUF reader leaves moe_intermediate_size at its default, 768, too
    "qwen3moe": (
        "Qwen3Moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
        },
    ),
    # and Qwen2-MoE's sizes at their defaults too (1,408 an expert, 5,632 the shared one)
    "qwen2moe": ("Qwen2Moe", {"num_experts": 4, "num_experts_per_tok": 2}),
}
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    **{f"mlp.shared_expert.{p}_proj.weight": f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")},
}
TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _add(writer: Any, name: str, data: np.ndarray) -> None:
    """Q8_0 for projections, F32 for 1-D tensors and the router, F16 for the rest (as llama.cpp
    stores them)."""
    if data.ndim == 1 or "gate_inp" in name:
        writer.add_tensor(name, data.astype(np.float32))
    elif "attn_" in name or "ffn_" in name:
        writer.add_tensor(name, gguf.quants.quantize(data, Q8), raw_dtype=Q8)
    else:
        writer.add_tensor(name, data.astype(np.float16))


def _write_gguf(path: Path, arch: str, hf_model: Any) -> None:
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    if arch in ("qwen3moe", "qwen2moe"):
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    w.add_eos_token_id(2)
    weights = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    for hf, name in TOP.items():
        _add(w, name, weights[hf])
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        for hf, name in LAYER.items():
            if p + hf in weights:
                tensor = weights[p + hf]
                vector = "gate_inp_shexp" in name  # llama.cpp stores that gate as a vector
                _add(w, f"blk.{layer}.{name}", tensor.reshape(-1) if vector else tensor)
        if p + "mlp.experts.down_proj" in weights:  # transformers 5 holds the experts fused
            gate, up = np.split(weights[p + "mlp.experts.gate_up_proj"], 2, axis=1)
            for name, merged in (("gate", gate), ("up", up), ("down", weights[p + "mlp.experts.down_proj"])):  # fmt: skip
                _add(w, f"blk.{layer}.ffn_{name}_exps.weight", np.ascontiguousarray(merged))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def qwen_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(GGUF path, transformers' model read from that file) of a tiny random model."""
    arch = request.param
    name, extra = FAMILIES[arch]
    folder = tmp_path_factory.mktemp(f"{arch}_gguf")
    source = saved_family(folder / "hf", name, {**TINY, **extra})
    path = folder / f"tiny-{arch}.gguf"
    _write_gguf(path, arch, source)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=path.name, dtype=torch.float32
    )
    return path, reference.eval()


def test_config_from_metadata(qwen_gguf: Any) -> None:
    from troupe.gpu.gguf_weights import read_gguf_config

    path, reference = qwen_gguf
    config = read_gguf_config(path)
    expected = ModelConfig.from_hf_dict(reference.config.to_dict())
    for field in ("model_type", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "qkv_bias", "qk_norm", "rope_theta"):  # fmt: skip
        assert getattr(config, field) == getattr(expected, field), field
    assert not config.tie_word_embeddings


def _runner(path: Path, quantization: Any) -> Any:
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions
    from troupe.gpu.weights import load_model

    config, model = load_model(
        path, torch.float32, torch.device("cpu"), 128, quantization=quantization
    )
    options = RunnerOptions(block_size=4, num_gpu_blocks=64, max_model_len=128)
    return ModelRunner(config, model, options)


def test_greedy_equals_transformers(qwen_gguf: Any, mt: Any) -> None:
    path, reference = qwen_gguf
    expected = [mt.hf_greedy(reference, p, NUM_NEW) for p in PROMPTS]
    driver = mt.PlanDriver(_runner(path, "dequantize"), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token


def test_q8_projections_load_kept(qwen_gguf: Any, mt: Any) -> None:
    from troupe.gpu.quant_linear import Int8Linear

    runner = _runner(qwen_gguf[0], "keep")
    layer = runner.model.layers[0]
    assert isinstance(layer.qkv_proj, Int8Linear) and isinstance(layer.o_proj, Int8Linear)
    driver = mt.PlanDriver(runner, chunk=5)
    driver.add("r", PROMPTS[0])
    driver.run(3)
    assert len(driver.seqs["r"].output) == 3
