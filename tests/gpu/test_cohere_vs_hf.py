"""Cohere (transformers' CohereForCausalLM: Command R, R+ with use_qk_norm) and Cohere 2
(Cohere2ForCausalLM: Command R7B and A): a parallel block under one LayerNorm, interleaved
RoPE, logits times logit_scale, tied embeddings; R+'s per-head q / k LayerNorms; Cohere 2's
windowed layers (4 tokens here, shorter than the prompts) beside global ones without RoPE.
Greedy token-identical to HF transformers (fp32) through chunked prefill, every norm weight
drawn away from 1 (per head too) and every bias away from 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

COMMON = {**TINY, "head_dim": 16, "layer_norm_eps": 1e-5, "logit_scale": 0.5}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "cohere": ("Cohere", {}),
    "cohere_qk_norm": ("Cohere", {"use_qk_norm": True, "attention_bias": True}),
    "cohere2": (
        "Cohere2",
        {"num_hidden_layers": 4, "sliding_window": 4, "sliding_window_pattern": 2},
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    prefix, extra = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    hf_model = saved_family(folder, prefix, {**COMMON, **extra}, biases=True)
    return request.param, folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:], device="cuda")


def test_the_config_reads_cohere_fields(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    name, folder, _ = family
    config = ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))
    assert config.layer_norm and config.rope_interleaved and config.tie_word_embeddings
    assert (config.logit_scale, config.rms_norm_eps) == (0.5, 1e-5)
    assert config.qk_norm == (name == "cohere_qk_norm")
    assert config.qkv_bias == config.o_bias == (name == "cohere_qk_norm")
    if name == "cohere2":  # every 2nd layer global, and unrotated
        assert config.layer_windows == (4, 0, 4, 0)
        assert config.nope_layers == (False, True, False, True)
    else:
        assert (config.layer_windows, config.nope_layers) == ((), ())


def test_the_logits_are_scaled(family: tuple[str, Path, Any]) -> None:
    """logit_scale moves no greedy token, so it is checked where it is applied."""
    from troupe.gpu.model_config import ModelConfig

    config, logits = ModelConfig.from_hf_folder(family[1]), torch.randn(2, 8)
    assert torch.equal(config.final_logits(logits), logits * 0.5)
