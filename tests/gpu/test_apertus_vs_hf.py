"""Apertus (transformers' ApertusForCausalLM, Swiss AI's Apertus 8B / 70B): Llama's layer with
q / k norms per head before the rotary, its norms named attention_layernorm and
feedforward_layernorm, and an MLP without a gate through xIELU, whose scalars each layer learns
(gpu/apertus_layer.py). Greedy token-identical to HF transformers (fp32) through chunked
prefill, the scalars drawn per layer (beta and eps too); the same checkpoint with two layers'
beta swapped answers otherwise; another activation refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import (
    LLAMA3_ROPE,
    TINY,
    assert_edit_matters,
    assert_greedy_matches,
    saved_family,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("apertus")
    settings = {**TINY, "rope_parameters": LLAMA3_ROPE, "dtype": torch.float32}
    hf_model = saved_family(folder, "Apertus", settings)
    with torch.no_grad():  # beta and eps are buffers transformers starts at 0.5 and -1e-6
        for i, layer in enumerate(hf_model.model.layers):
            layer.mlp.act_fn.beta.fill_(0.3 + 0.2 * i)
            layer.mlp.act_fn.eps.fill_(-0.01)
    hf_model.save_pretrained(folder)
    return folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved, device="cuda")


def test_each_layer_reads_its_own_scalars(saved: tuple[Path, Any], tmp_path: Path) -> None:
    def swapped(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        first, second = (f"model.layers.{i}.mlp.act_fn.beta" for i in (0, 1))
        return tensors | {first: tensors[second], second: tensors[first]}

    assert_edit_matters(*saved, tmp_path, swapped)


def test_the_config(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    cfg = json.loads((saved[0] / "config.json").read_text())
    config = ModelConfig.from_hf_dict(cfg)
    assert config.hidden_act == "xielu" and config.qk_norm and not config.gated_mlp
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "llama3"
    with pytest.raises(ModelLoadError, match="hidden_act 'relu2' is not supported for apertus"):
        ModelConfig.from_hf_dict({**cfg, "hidden_act": "relu2"})
