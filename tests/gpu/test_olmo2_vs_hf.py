"""OLMo 2 (norms after attention and MLP, none before; q and k RMS-normalised across all heads)
is greedy token-identical to HF transformers (fp32) through chunked prefill, from the folder
transformers saves (its norm weights drawn away from 1, so each must land in its place), on the
CPU and on CUDA; tensor parallelism is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_random_model

TINY_OLMO2 = {**TINY, "num_hidden_layers": 3, "rope_theta": 1000.0}


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
