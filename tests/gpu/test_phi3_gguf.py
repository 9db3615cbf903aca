"""Phi-3 from a GGUF file (arch "phi3", gpu/gguf_arch.py), written as llama.cpp's
convert_hf_to_gguf.py writes one: q|k|v fused in attn_qkv and gate|up fused in ffn_up (twice
feed_forward_length rows), the window in attention.sliding_window, the rotated dims in
rope.dimension_count, and a long-context model's longrope factors as the tensors
rope_factors_long / rope_factors_short. Greedy token-identical (fp32, CPU, chunked prefill) to
transformers reading the same Q8_0 file (`gguf_file=`), and, for Phi-4-mini's shape (3/4 of
each head rotated, longrope: transformers' GGUF reader keeps neither), to the model the F32 file
was written from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family
from tests.gpu.test_longrope_vs_hf import settings as longrope_settings

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

Q8, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
WINDOW = 64  # past every sequence here: transformers' GGUF reader drops it


def _write_gguf(path: Path, hf_model: Any, quantize: bool) -> None:
    c = hf_model.config
    rope = c.rope_parameters
    head_dim = c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_sliding_window(WINDOW)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)  # else transformers takes Phi3Config's 32,000, past this vocabulary
    if rope.get("rope_type") == "longrope":
        w.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
        for kind in ("long", "short"):
            w.add_tensor(
                f"rope_factors_{kind}.weight", np.array(rope[f"{kind}_factor"], np.float32)
            )
    weights = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    names = [(hf, name) for hf, name in TOP.items()]
    for layer in range(c.num_hidden_layers):
        names += [
            (f"model.layers.{layer}.{hf}", f"blk.{layer}.{name}") for hf, name in LAYER.items()
        ]
    for hf, name in names:
        data = weights[hf]
        if data.ndim == 2 and quantize and ("attn_" in name or "ffn_" in name):
            w.add_tensor(name, gguf.quants.quantize(data, Q8), raw_dtype=Q8)
        else:
            w.add_tensor(name, data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# name: (the HF settings, Q8_0 projections, the reference is transformers reading the file)
CASES = {
    "phi3-mini": ({**TINY, "rope_theta": 1000.0, "original_max_position_embeddings": 256}, True),
    "phi4-mini-long": (longrope_settings("phi4-mini-long"), False),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def phi3_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(case, GGUF path, the reference model) of a tiny random Phi-3."""
    name = request.param
    hf_settings, quantize = CASES[name]
    folder = tmp_path_factory.mktemp(name)
    source = saved_family(folder / "hf", "Phi3", {**hf_settings, "tie_word_embeddings": False})
    path = folder / f"tiny-{name}.gguf"
    _write_gguf(path, source, quantize)
    if not quantize:
        return name, path, source
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=path.name, dtype=torch.float32
    )
    return name, path, reference.eval()


def test_greedy_equals_the_reference(phi3_gguf: Any) -> None:
    _, path, reference = phi3_gguf
    assert_greedy_matches(path, reference)


def test_config_from_metadata(phi3_gguf: Any) -> None:
    from troupe.gpu.gguf_weights import read_gguf_config

    name, path, _ = phi3_gguf
    config = read_gguf_config(path)
    assert config.model_type == "phi3" and config.layer_windows == (WINDOW, WINDOW)
    if name == "phi4-mini-long":
        assert config.rotary_dim == 12 and config.rope_scaling is not None
        assert config.rope_scaling["rope_type"] == "longrope"
        assert (
            config.rope_scaling["long_factor"] == CASES[name][0]["rope_parameters"]["long_factor"]
        )
    else:
        assert config.rope_scaling is None and not config.rotary_dim  # the whole head
