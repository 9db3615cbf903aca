"""Mixtral (experts in every layer, Mixtral's checkpoint names block_sparse_moe.experts.<e>.w1 /
w3 / w2, a sliding window) is greedy token-identical to HF transformers (fp32) through chunked
prefill, from the folder transformers itself saves, on the CPU and on CUDA (the fused Triton
MoE, windowed paged attention, CUDA graphs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.model_config import ModelConfig, ModelLoadError

from tests.gpu.family_checks import assert_greedy_matches, saved_random_model

TINY_MIXTRAL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,  # one expert's
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
    "sliding_window": 8,  # shorter than the prompts: the window matters
}


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import transformers

    folder = tmp_path_factory.mktemp("mixtral")
    config = transformers.MixtralConfig(**TINY_MIXTRAL)
    return folder, saved_random_model(folder, transformers.MixtralForCausalLM, config)


def test_config_reads_the_experts() -> None:
    base = {"model_type": "mixtral", **TINY_MIXTRAL}
    config = ModelConfig.from_hf_dict(base)
    moe = config.moe
    assert moe is not None and moe.sparse_layers == (True, True)
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (4, 2, 48)
    assert moe.norm_topk_prob and config.layer_windows == (8, 8)
    with pytest.raises(ModelLoadError, match="num_local_experts"):
        ModelConfig.from_hf_dict({k: v for k, v in base.items() if k != "num_local_experts"})


def test_greedy_matches_hf_from_mixtrals_names(mixtral: tuple[Path, Any]) -> None:
    from safetensors import safe_open

    folder, hf_model = mixtral
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight" in names
    assert "model.layers.1.block_sparse_moe.gate.weight" in names
    assert_greedy_matches(folder, hf_model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(mixtral: tuple[Path, Any]) -> None:
    assert_greedy_matches(*mixtral, device="cuda")
