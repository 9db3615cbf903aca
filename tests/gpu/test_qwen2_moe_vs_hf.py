"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases), softmax top-k
routing without renormalisation, and a shared expert every token runs, gated per token by
sigmoid(shared_expert_gate . x); a dense first layer (mlp_only_layers). Greedy token-identical to
HF transformers (fp32) through chunked prefill, from the folder transformers saves; tensor
parallelism is refused by name; random weights (gpu/weights.random_weights) load as a
checkpoint's do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

TINY_QWEN2_MOE = {
    **TINY,
    "num_hidden_layers": 3,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": False,
    "mlp_only_layers": [0],
    "rope_theta": 1000.0,
}


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("qwen2_moe")
    return folder, saved_family(folder, "Qwen2Moe", TINY_QWEN2_MOE)


def test_greedy_matches_hf_with_chunked_prefill(qwen2_moe: tuple[Path, Any]) -> None:
    assert_greedy_matches(*qwen2_moe)


def test_the_shared_expert_is_read(qwen2_moe: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.models import DecoderModel
    from troupe.gpu.moe_layer import MoeLayer
    from troupe.gpu.weight_fill import fill_weights
    from troupe.gpu.weights import random_weights

    config = ModelConfig.from_hf_folder(qwen2_moe[0])
    assert config.moe is not None and config.moe.gated_shared_size == 40
    assert config.moe.sparse_layers == (False, True, True) and config.qkv_bias
    model = DecoderModel(config, torch.float32, torch.device("cpu"), 64)
    fill_weights(model, random_weights(config, torch.float32, 0).items(), "random")
    layer = model.layers[1]
    assert isinstance(layer, MoeLayer) and layer.shared_gate is not None
    assert layer.shared_gate.shape == (1, 64)


def test_tensor_parallelism_is_refused(qwen2_moe: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    config = ModelConfig.from_hf_folder(qwen2_moe[0])
    with pytest.raises(ModelLoadError, match="qwen2_moe: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 1)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(qwen2_moe: tuple[Path, Any]) -> None:
    assert_greedy_matches(*qwen2_moe, device="cuda")
