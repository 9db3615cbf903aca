"""Ministral 3 (transformers' Ministral3ForCausalLM): Mistral's layers under yarn, with the
queries scaled by position past the yarn scaling's original length (gpu/query_scale.py). The
test model's original length is 8 tokens, so its prompts and answers run through factors 1 to
1 + 0.5 log 4; greedy token-identical to HF transformers (fp32) through chunked prefill, and
the same model without the scale answers otherwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1000.0,
    "factor": 32.0,
    "original_max_position_embeddings": 8,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.5,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("ministral3")
    settings = {**TINY, "head_dim": 16, "rope_parameters": ROPE}
    return folder, saved_family(folder, "Ministral3", settings)


def test_greedy_matches_hf_with_chunked_prefill(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(saved: tuple[Path, Any]) -> None:
    """The factor table on the device, through the Triton kernels and CUDA graphs."""
    assert_greedy_matches(*saved, device="cuda")


def test_without_the_scale_the_answers_differ(saved: tuple[Path, Any], tmp_path: Path) -> None:
    folder, hf_model = saved
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    cfg = json.loads((plain / "config.json").read_text())
    del cfg["rope_parameters"]["llama_4_scaling_beta"]
    (plain / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AssertionError):
        assert_greedy_matches(plain, hf_model)


def test_the_scale_is_read(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.query_scale import factor_table, position_scaled

    folder, _ = saved
    assert ModelConfig.from_hf_folder(folder).query_scale == (0.5, 8)
    q = torch.ones(4, 1, 1)
    factors = factor_table(0.5, 8, 24, torch.device("cpu"))
    scaled = position_scaled(q, torch.tensor([0, 7, 8, 23]), factors).flatten()
    expected = 1 + 0.5 * torch.log(torch.tensor([1.0, 1.0, 2.0, 3.0]))
    torch.testing.assert_close(scaled, expected)


def test_a_beta_without_its_length_is_refused() -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    cfg = {"model_type": "ministral3", **TINY, "rope_parameters": {"rope_type": "default",
           "rope_theta": 1000.0, "llama_4_scaling_beta": 0.1}}  # fmt: skip
    with pytest.raises(ModelLoadError, match="llama_4_scaling_beta needs"):
        ModelConfig.from_hf_dict(cfg)
