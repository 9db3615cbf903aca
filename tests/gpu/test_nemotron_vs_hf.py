"""Nemotron (transformers' NemotronForCausalLM: Minitron, Nemotron-4): StarCoder2's ungated
layer (gpu/starcoder2_layer.py) under other names, with a squared ReLU, LayerNorm1P norms
(weight + 1, with biases) and RoPE on half of each head. Greedy token-identical to HF
transformers (fp32) through chunked prefill, every norm weight and bias drawn away from its
start, with and without the attention and MLP biases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

SETTINGS = {
    **{key: value for key, value in TINY.items() if key != "rms_norm_eps"},
    "head_dim": 16,
    "norm_eps": 1e-5,
}
FAMILIES = {"biases": {"attention_bias": True, "mlp_bias": True}, "plain": {}}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp(request.param)
    extra = FAMILIES[request.param]
    hf_model = saved_family(folder, "Nemotron", {**SETTINGS, **extra}, biases=True)
    return request.param, folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:], device="cuda")


def test_the_config_reads_nemotron_fields(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    name, folder, _ = family
    config = ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))
    biased = name == "biases"
    assert (config.qkv_bias, config.o_bias, config.mlp_bias) == (biased,) * 3
    assert config.layer_norm and config.norm_bias and config.hidden_act == "relu2"
    assert (config.rotary_dim, config.rms_norm_eps) == (8, 1e-5)  # half of each head


def test_lora_on_its_mlp_is_refused(family: tuple[str, Path, Any], tmp_path: Path) -> None:
    """A PEFT adapter on up_proj: Nemotron's MLP has no gate|up for it, so it is refused by
    name, not left out."""
    from safetensors.torch import save_file
    from troupe.gpu.lora_adapter import load_adapter
    from troupe.gpu.model_config import ModelConfig

    _, folder, _ = family
    config = ModelConfig.from_hf_folder(folder)
    settings = {"r": 2, "lora_alpha": 4, "target_modules": ["up_proj"], "peft_type": "LORA"}
    (tmp_path / "adapter_config.json").write_text(json.dumps(settings))
    prefix = "base_model.model.model.layers.0.mlp.up_proj"
    factors = {
        f"{prefix}.lora_A.weight": torch.zeros(2, 64),
        f"{prefix}.lora_B.weight": torch.zeros(96, 2),
    }
    save_file(factors, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(Exception, match="ungated MLP"):
        load_adapter("a", str(tmp_path), config, 8)
