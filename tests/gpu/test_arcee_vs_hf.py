"""Arcee (transformers' ArceeForCausalLM, AFM-4.5B): Llama's layers (RMSNorms, q/k/v/o) with
Nemotron's MLP, up_proj -> relu(x)^2 -> down_proj, no gate (gpu/starcoder2_layer.
UngatedMlpLayer). Greedy token-identical to HF transformers (fp32) through chunked prefill,
with MLP biases on and off; another activation, and tensor parallelism, refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "mlp_bias"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("arcee")
    settings = {**TINY, "rope_theta": 1000.0, "mlp_bias": request.param}
    return folder, saved_family(folder, "Arcee", settings, biases=request.param)


def test_greedy_matches_hf_with_chunked_prefill(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved, device="cuda")


def test_the_config(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    cfg = json.loads((saved[0] / "config.json").read_text())
    config = ModelConfig.from_hf_dict(cfg)
    assert config.hidden_act == "relu2" and not config.gated_mlp
    with pytest.raises(ModelLoadError, match="hidden_act 'silu' is not supported for arcee"):
        ModelConfig.from_hf_dict({**cfg, "hidden_act": "silu"})
    with pytest.raises(ModelLoadError, match="tensor parallelism is not supported"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 1)  # type: ignore[arg-type]
