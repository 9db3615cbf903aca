"""DeepSeek-V2 / V3 config.json: MLA and MoE fields read into a ModelConfig, bad fields named."""

from __future__ import annotations

import math

import pytest
from troupe.gpu.deepseek_config import deepseek_fields
from troupe.gpu.model_config import ModelConfig, ModelLoadError

# DeepSeek-V2-Lite's config.json (the fields that matter here)
V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1,
    "topk_group": 1, "topk_method": "greedy", "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "norm_topk_prob": False, "routed_scaling_factor": 1.0,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
}  # fmt: skip


def test_v2_lite_shape() -> None:
    mla, moe = deepseek_fields(V2_LITE, 27)
    # V2 rotates interleaved pairs (transformers' complex product), whatever the config says
    assert mla.latent_size == 576 and mla.q_lora_rank == 0 and mla.rope_interleave
    # a GQA cache of the same heads would hold 16 * (192 + 128) values per token
    assert 16 * (192 + 128) / mla.latent_size > 8
    mscale = 0.1 * 0.707 * math.log(40) + 1.0
    assert math.isclose(mla.softmax_scale, 192**-0.5 * mscale**2)
    assert moe is not None and moe.sparse_layers == (False,) + (True,) * 26
    assert (moe.num_experts, moe.num_shared_experts, moe.top_k) == (64, 2, 6)
    assert moe.routing is not None and moe.routing.method == "greedy"


def test_transformers_configs_parse() -> None:
    import transformers

    shape = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
             "vocab_size": 64, "num_experts_per_tok": 2}  # fmt: skip
    v3 = transformers.DeepseekV3Config(**shape).to_dict()
    mla, moe = deepseek_fields(v3, 3)
    assert mla.rope_interleave and mla.q_lora_rank == 1536
    assert moe is None  # first_k_dense_replace 3 of 3 layers: all dense
    _, moe = deepseek_fields({**v3, "first_k_dense_replace": 2}, 3)
    assert moe is not None and moe.routing is not None and moe.sparse_layers[2]
    assert moe.routing.method == "noaux_tc" and moe.routing.norm_topk_prob
    assert (moe.routing.num_groups, moe.routing.topk_groups) == (8, 4)
    v2 = transformers.DeepseekV2Config(**shape, first_k_dense_replace=1).to_dict()
    _, moe2 = deepseek_fields(v2, 3)
    assert moe2 is not None and moe2.sparse_layers == (False, True, True)
    for cfg in (v3, v2):
        config = ModelConfig.from_hf_dict(cfg)
        assert config.mla is not None and config.head_dim == config.mla.qk_rope_head_dim
        assert config.kv_values_per_token == config.mla.latent_size  # one plane, one "head"
    assert ModelConfig.from_hf_dict(v3).num_mtp_layers == 1


def test_bad_fields_are_named() -> None:
    with pytest.raises(ModelLoadError, match="kv_lora_rank"):
        ModelConfig.from_hf_dict({**V2_LITE, "kv_lora_rank": 0})
    with pytest.raises(ModelLoadError, match="n_group"):
        ModelConfig.from_hf_dict({**V2_LITE, "n_group": 5})
    with pytest.raises(ModelLoadError, match="rope_scaling type 'dynamic'"):
        ModelConfig.from_hf_dict({**V2_LITE, "rope_scaling": {"type": "dynamic", "factor": 2}})
    with pytest.raises(ModelLoadError, match="topk_method"):
        ModelConfig.from_hf_dict({**V2_LITE, "topk_method": "random"})
