"""dots.llm1 (dots1): Qwen3's attention (per-head q/k norms, no biases) over DeepSeek-V3's
experts (sigmoid routing with the correction bias over groups, shared experts,
routed_scaling_factor) from first_k_dense_replace on, and Qwen2-style windows from
max_window_layers on. Greedy token-identical to HF transformers (fp32) through chunked prefill,
from the folder transformers saves; tensor parallelism is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

TINY_DOTS1 = {
    **TINY,
    "num_hidden_layers": 3,
    "head_dim": 16,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "rope_theta": 100.0,
    "sliding_window": 5,  # the last layer attends to a window of 5 keys
    "max_window_layers": 2,
}


@pytest.fixture(scope="module")
def dots1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("dots1")
    hf_model = saved_family(folder, "Dots1", TINY_DOTS1)
    with torch.no_grad():  # a correction bias that changes the choice of experts
        for name, buffer in hf_model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.linspace(-0.3, 0.3, buffer.numel()).flip(0))
    hf_model.save_pretrained(folder)
    return folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(dots1: tuple[Path, Any]) -> None:
    assert_greedy_matches(*dots1)


def test_the_layers_are_read_as_declared(dots1: tuple[Path, Any]) -> None:
    from troupe.gpu.grouped_moe_layer import GroupedMoeLayer
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.models import DecoderLayer, DecoderModel

    config = ModelConfig.from_hf_folder(dots1[0])
    assert config.moe is not None and config.moe.routing is not None
    assert config.moe.sparse_layers == (False, True, True)
    assert config.moe.routing.method == "noaux_tc" and config.moe.routing.norm_topk_prob
    assert config.moe.routing.routed_scaling_factor == 2.5 and config.moe.num_shared_experts == 1
    assert config.qk_norm and not config.qkv_bias and not config.o_bias
    assert config.layer_windows == (0, 0, 5)
    model = DecoderModel(config, torch.float32, torch.device("cpu"), 64)
    assert [type(layer) for layer in model.layers] == [
        DecoderLayer,
        GroupedMoeLayer,
        GroupedMoeLayer,
    ]


def test_tensor_parallelism_is_refused(dots1: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    config = ModelConfig.from_hf_folder(dots1[0])
    with pytest.raises(ModelLoadError, match="dots1: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 1)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(dots1: tuple[Path, Any]) -> None:
    assert_greedy_matches(*dots1, device="cuda")
