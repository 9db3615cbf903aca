"""Per-layer sliding windows and Gemma 3's fields, read from both config.json spellings."""

from __future__ import annotations

import pytest
import torch
from troupe.gpu.hf_families import gemma_fields, layer_windows
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.kernels.rope_cache import rope_inv_freq


def test_layer_windows_by_family() -> None:
    assert layer_windows({"sliding_window": 8}, "mistral", 3) == (8, 8, 8)
    assert layer_windows({"sliding_window": None}, "mistral", 3) == ()
    assert layer_windows({"sliding_window": 8}, "llama", 2) == (8, 8)
    qwen = {"sliding_window": 8, "max_window_layers": 2}
    assert layer_windows(qwen, "qwen2", 4) == ()  # use_sliding_window defaults to False
    assert layer_windows({**qwen, "use_sliding_window": True}, "qwen2", 4) == (0, 0, 8, 8)
    gemma = {"sliding_window": 4, "sliding_window_pattern": 3}
    assert layer_windows(gemma, "gemma3_text", 7) == (4, 4, 0, 4, 4, 0, 4)
    types = ["full_attention", "sliding_attention"]
    assert layer_windows({"sliding_window": 4, "layer_types": types}, "gemma3_text", 2) == (0, 4)
    with pytest.raises(ValueError, match="layer_types has 2 entries"):
        layer_windows({"sliding_window": 4, "layer_types": types}, "gemma3_text", 3)


def test_gemma3_fields_old_and_new_spelling() -> None:
    old = {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 256,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}  # fmt: skip
    new = {"query_pre_attn_scalar": 256, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}  # fmt: skip
    for cfg in (old, new):
        fields = gemma_fields(cfg, "gemma3_text")
        assert fields["rope_theta"] == 1e6 and fields["rope_local_theta"] == 1e4
        assert fields["rope_scaling"]["factor"] == 8.0
        assert fields["hidden_act"] == "gelu_tanh" and fields["qk_norm"]
    with pytest.raises(ValueError, match="hidden_activation"):
        gemma_fields({"hidden_activation": "relu"}, "gemma3_text")


def test_model_config_reads_windows_and_names_bad_ones() -> None:
    base = {"model_type": "mistral", "num_attention_heads": 4, "hidden_size": 64,
            "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256}  # fmt: skip
    mistral = ModelConfig.from_hf_dict({**base, "sliding_window": 16})
    assert mistral.layer_windows == (16, 16) and mistral.kv_window == 16
    # a full layer keeps all KV: nothing is released (interleaved Gemma 3, Qwen2's low layers)
    qwen = {**base, "model_type": "qwen2", "sliding_window": 16, "use_sliding_window": True,
            "max_window_layers": 1}  # fmt: skip
    assert ModelConfig.from_hf_dict(qwen).layer_windows == (0, 16)
    assert ModelConfig.from_hf_dict(qwen).kv_window == 0
    assert ModelConfig.from_hf_dict(base).kv_window == 0
    with pytest.raises(ModelLoadError, match="layer_types"):
        ModelConfig.from_hf_dict({**base, "sliding_window": 16, "layer_types": ["x"]})


def test_linear_rope_scaling_divides_frequencies() -> None:
    plain = rope_inv_freq(8, 1e4, None)
    torch.testing.assert_close(
        rope_inv_freq(8, 1e4, {"rope_type": "linear", "factor": 4.0}), plain / 4
    )
