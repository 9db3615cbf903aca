"""StarCoder2 and Nemotron from GGUF files (archs "starcoder2" and "nemotron",
gpu/gguf_arch.py), written as llama.cpp's convert_hf_to_gguf.py writes them: biased LayerNorms
(attn_norm, ffn_norm, output_norm; Nemotron's LayerNorm1P weights with their 1 added), the MLP
without a gate as ffn_up / ffn_down, StarCoder2's biases on every projection, Nemotron's half
rotary in rope.dimension_count, the norms' eps in attention.layer_norm_epsilon, projections
Q8_0. Greedy token-identical (fp32, CPU, chunked prefill) to transformers reading the same
file (`gguf_file=`); the config read from the metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

Q8 = gguf.GGMLQuantizationType.Q8_0
ATTENTION = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
}
# arch: (transformers' prefix, its settings, its MLP's names -> the file's)
ARCHS = {
    "starcoder2": (
        "Starcoder2",
        {"norm_epsilon": 1e-5, "tie_word_embeddings": False},
        {"mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"},
    ),
    "nemotron": (
        "Nemotron",
        {"norm_eps": 1e-5, "tie_word_embeddings": False},
        {"mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"},
    ),
}


def _write_gguf(path: Path, arch: str, hf_model: Any) -> None:
    c = hf_model.config
    head_dim = c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if arch == "nemotron":  # transformers' default: half of each head
        w.add_rope_dimension_count(head_dim // 2)
    w.add_vocab_size(c.vocab_size)
    # transformers' GGUF reader takes StarCoder2's vocabulary size from the token list only
    w.add_token_list([f"<t{i}>" for i in range(c.vocab_size)])
    w.add_eos_token_id(2)
    weights = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    names = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("lm_head.weight", "output.weight"),
    ]
    names += [(f"model.norm.{p}", f"output_norm.{p}") for p in ("weight", "bias")]
    for i in range(c.num_hidden_layers):
        for hf, name in (ATTENTION | ARCHS[arch][2]).items():
            for p in ("weight", "bias"):
                if f"model.layers.{i}.{hf}.{p}" in weights:
                    names.append((f"model.layers.{i}.{hf}.{p}", f"blk.{i}.{name}.{p}"))
    for hf, name in names:
        data = weights[hf]
        if arch == "nemotron" and name.endswith("norm.weight"):
            data = data + 1  # LayerNorm1P's weight, as llama.cpp's converter stores it
        if data.ndim == 2 and name.startswith("blk."):
            w.add_tensor(name, gguf.quants.quantize(data, Q8), raw_dtype=Q8)
        else:
            w.add_tensor(name, data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=sorted(ARCHS))
def layernorm_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(arch, GGUF path, transformers' model read from that file) of a tiny random model."""
    arch = request.param
    prefix, settings, _ = ARCHS[arch]
    folder = tmp_path_factory.mktemp(f"{arch}_gguf")
    settings = {**TINY, "rope_theta": 10000.0, **settings}
    source = saved_family(folder / "hf", prefix, settings, biases=arch == "starcoder2")
    path = folder / f"tiny-{arch}.gguf"
    _write_gguf(path, arch, source)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=path.name, dtype=torch.float32
    )
    return arch, path, reference.eval()


def test_greedy_equals_transformers(layernorm_gguf: Any) -> None:
    _, path, reference = layernorm_gguf
    assert_greedy_matches(path, reference)


def test_config_from_metadata(layernorm_gguf: Any) -> None:
    from troupe.gpu.gguf_weights import read_gguf_config

    arch, path, _ = layernorm_gguf
    config = read_gguf_config(path)
    assert config.model_type == arch and config.layer_norm and config.norm_bias
    assert config.rms_norm_eps == pytest.approx(1e-5) and not config.tie_word_embeddings
    assert not config.gated_mlp
    biased = arch == "starcoder2"  # Nemotron's biases are off here, as the file has none
    assert config.qkv_bias == config.o_bias == config.mlp_bias == biased
    assert config.rotary_dim == (8 if arch == "nemotron" else 0)
