"""OLMo 2 (norms after attention and MLP, none before; q and k RMS-normalised across all heads)
and OLMoE (pre-norm MoE layers under the same q / k norms, q, k and v clamped to clip_qkv) are
greedy token-identical to HF transformers (fp32) through chunked prefill, from the folder
transformers saves (its norm weights drawn away from 1, so each must land in its place), on the
CPU and on CUDA; tensor parallelism is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import (
    PROMPTS,
    TINY,
    assert_greedy_matches,
    saved_family,
    saved_random_model,
)

TINY_OLMO2 = {**TINY, "num_hidden_layers": 3, "rope_theta": 1000.0}
# 4 experts, 2 a token, unnormalised weights (transformers' default); clip_qkv 1.5 clamps many
# of these q, k and v values (test_olmoe_clip_matters)
TINY_OLMOE = {**TINY_OLMO2, "num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": 1.5}


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import transformers

    folder = tmp_path_factory.mktemp("olmo2")
    config = transformers.Olmo2Config(**TINY_OLMO2)
    return folder, saved_random_model(folder, transformers.Olmo2ForCausalLM, config, norms=True)


def test_greedy_matches_hf_with_chunked_prefill(olmo2: tuple[Path, Any]) -> None:
    assert_greedy_matches(*olmo2)


def test_tensor_parallelism_is_refused(olmo2: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    config = ModelConfig.from_hf_folder(olmo2[0])
    with pytest.raises(ModelLoadError, match="olmo2: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 0)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(olmo2: tuple[Path, Any]) -> None:
    assert_greedy_matches(*olmo2, device="cuda")


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("olmoe")
    return folder, saved_family(folder, "Olmoe", TINY_OLMOE)


def test_olmoe_greedy_matches_hf(olmoe: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    config = ModelConfig.from_hf_folder(olmoe[0])
    assert config.moe is not None and not config.moe.norm_topk_prob and config.clip_qkv == 1.5
    assert_greedy_matches(*olmoe)


def test_olmoe_clip_matters(olmoe: tuple[Path, Any]) -> None:
    hf_model = olmoe[1]
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        clipped = hf_model(ids).logits[0, -1]
        hf_model.config.clip_qkv = None
        try:
            unclipped = hf_model(ids).logits[0, -1]
        finally:
            hf_model.config.clip_qkv = TINY_OLMOE["clip_qkv"]
    assert (clipped - unclipped).abs().max() > 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_olmoe_cuda_kernels_match_hf(olmoe: tuple[Path, Any]) -> None:
    assert_greedy_matches(*olmoe, device="cuda")
