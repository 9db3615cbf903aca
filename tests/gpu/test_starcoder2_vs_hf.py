"""StarCoder2 (transformers' Starcoder2ForCausalLM): biased LayerNorms, biases on every
projection, a tanh-GELU MLP without a gate (c_fc, c_proj), windows on every layer (4 tokens
here, shorter than the prompts), tied embeddings. Greedy token-identical to HF transformers
(fp32) through chunked prefill, every norm weight drawn away from 1 and every bias away from
0; and with use_bias off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

COMMON = {**TINY, "head_dim": 16, "norm_epsilon": 1e-5, "sliding_window": 4}
FAMILIES = {"biases": {}, "no_biases": {"use_bias": False}}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp(request.param)
    settings = {key: value for key, value in COMMON.items() if key != "rms_norm_eps"}
    extra = FAMILIES[request.param]
    hf_model = saved_family(folder, "Starcoder2", {**settings, **extra}, biases=True)
    return request.param, folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:], device="cuda")


def test_the_config_reads_starcoder2_fields(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    name, folder, _ = family
    config = ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))
    biased = name == "biases"
    assert (config.qkv_bias, config.o_bias, config.mlp_bias) == (biased,) * 3
    assert config.layer_norm and config.norm_bias and config.tie_word_embeddings
    assert (config.hidden_act, config.rms_norm_eps, config.layer_windows) == (
        "gelu_tanh",
        1e-5,
        (4, 4),
    )


def test_pipeline_stages_load_their_part(family: tuple[str, Path, Any]) -> None:
    """Two pipeline stages of it load (the final norm's bias on the last one alone): each
    stage's layers hold the checkpoint's tensors, none missing."""
    from safetensors.torch import load_file
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.pp_model import PPStageModel
    from troupe.gpu.pp_stage import PPStage
    from troupe.gpu.pp_weights import load_stage

    _, folder, _ = family
    full = ModelConfig.from_hf_folder(folder)
    shipped = load_file(folder / "model.safetensors")
    for index in (0, 1):
        stage = PPStage.of(full, index, 2, None)
        model = PPStageModel(stage, full, None, torch.float32, torch.device("cpu"), 64)  # type: ignore[arg-type]
        load_stage(model, folder, full)
        layer = model.layers[0]
        bias = model.norm_bias
        assert bias is not None and bias.numel() == (64 if index else 0)
        if index:
            assert torch.equal(bias, shipped["model.norm.bias"])
        expected = shipped[f"model.layers.{index}.mlp.c_fc.weight"]
        assert torch.equal(layer.c_fc, expected)  # type: ignore[arg-type]
