"""Projection biases as each family declares them (gpu/hf_families.bias_fields): Llama's
attention_bias puts one on o_proj too and mlp_bias on gate/up/down, Qwen3's attention_bias on
q/k/v/o, Seed-OSS's attention_out_bias on o_proj alone. Greedy token-identical to HF
transformers (fp32) through chunked prefill, from the folder transformers saves, with every
bias drawn away from 0 (one left out shows); tensor parallelism is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY as FAMILY_TINY
from tests.gpu.family_checks import assert_greedy_matches, saved_family

TINY = {**FAMILY_TINY, "rope_theta": 1000.0}
FAMILIES: dict[str, tuple[str, dict[str, Any], dict[str, bool]]] = {
    "llama": (
        "Llama",
        {"attention_bias": True, "mlp_bias": True},
        {"qkv_bias": True, "o_bias": True, "mlp_bias": True},
    ),
    "qwen3": ("Qwen3", {"attention_bias": True}, {"qkv_bias": True, "o_bias": True}),
    "seed_oss": (
        "SeedOss",
        {"attention_bias": True, "attention_out_bias": False, "mlp_bias": True},
        {"qkv_bias": True, "mlp_bias": True},
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    name, extra, _ = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    hf_model = saved_family(folder, name, {**TINY, **extra}, norms=False, biases=True)
    return request.param, folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:])


def test_the_config_names_the_biases_the_checkpoint_has(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    name, folder, _ = family
    config = ModelConfig.from_hf_folder(folder)
    expected = {"qkv_bias": False, "o_bias": False, "mlp_bias": False, **FAMILIES[name][2]}
    assert {key: getattr(config, key) for key in expected} == expected


def test_tensor_parallelism_is_refused(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    config = ModelConfig.from_hf_folder(family[1])
    if not (config.o_bias or config.mlp_bias):
        pytest.skip("q/k/v biases alone shard with their rows")
    with pytest.raises(ModelLoadError, match="o_proj and MLP biases: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 0)  # type: ignore[arg-type]


def test_families_without_biases_ignore_attention_bias() -> None:
    from troupe.gpu.hf_families import bias_fields

    none = {"qkv_bias": False, "o_bias": False, "mlp_bias": False}
    for model_type in ("mistral", "ministral", "mixtral", "phi3"):
        assert bias_fields({"attention_bias": True, "mlp_bias": True}, model_type) == none
    assert bias_fields({}, "qwen2") == {**none, "qkv_bias": True}
    assert bias_fields({"attention_bias": True, "mlp_bias": True}, "qwen3")["mlp_bias"] is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:], device="cuda")
