"""Granite (Llama's layers with its four multipliers: embeddings, attention scale, residual
branches, logits) is greedy token-identical to HF transformers (fp32, CPU) through chunked
prefill, from the folder transformers saves, and each multiplier counts: a model read with
any one of them left at 1.0 answers other logits. GraniteMoE (the multipliers over Mixtral's
top-k experts, stored stacked: block_sparse_moe.input_linear / output_linear / router.layer)
too, and it refuses tensor parallelism by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.model_config import ModelConfig, ModelLoadError

from tests.gpu.family_checks import (
    NUM_NEW,
    PROMPTS,
    TINY,
    assert_greedy_matches,
    saved_random_model,
)

TINY_GRANITE = {
    **TINY,
    "rope_theta": 1000.0,
    "embedding_multiplier": 3.0,
    "attention_multiplier": 0.05,
    "residual_multiplier": 0.4,
    "logits_scaling": 2.5,
    "tie_word_embeddings": True,
}


@pytest.fixture(scope="module")
def granite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import transformers

    folder = tmp_path_factory.mktemp("granite")
    config = transformers.GraniteConfig(**TINY_GRANITE)
    return folder, saved_random_model(folder, transformers.GraniteForCausalLM, config)


def test_greedy_matches_hf_with_chunked_prefill(granite: tuple[Path, Any]) -> None:
    assert_greedy_matches(*granite)


@pytest.mark.parametrize(
    "left_out", ["embedding_multiplier", "attention_multiplier", "residual_multiplier"]
)
def test_each_multiplier_counts(
    granite: tuple[Path, Any], mt: Any, tmp_path: Path, left_out: str
) -> None:
    """The same weights read with one multiplier at 1.0 answer other tokens than transformers
    (so each is applied, not merely parsed); logits_scaling divides the logits."""
    folder, hf_model = granite
    expected = mt.hf_greedy(hf_model, PROMPTS[0], NUM_NEW)
    cfg = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, left_out: 1.0}))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    driver = mt.PlanDriver(mt.runner_for(tmp_path), chunk=5)
    driver.add("r", PROMPTS[0])
    driver.run(NUM_NEW)
    assert driver.seqs["r"].output != expected
    config, logits = ModelConfig.from_hf_folder(folder), torch.randn(2, 8)
    assert config.granite is not None and torch.equal(config.final_logits(logits), logits / 2.5)


def test_logits_scaling_zero_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="logits_scaling"):
        ModelConfig.from_hf_dict({"model_type": "granite", **TINY_GRANITE, "logits_scaling": 0})


@pytest.fixture(scope="module")
def granitemoe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import transformers

    folder = tmp_path_factory.mktemp("granitemoe")
    # embeddings at 1.5: at 3.0 the random experts answer one token over and over
    settings = {**TINY_GRANITE, "num_local_experts": 4, "num_experts_per_tok": 2,
                "embedding_multiplier": 1.5}  # fmt: skip
    config = transformers.GraniteMoeConfig(**settings)
    return folder, saved_random_model(folder, transformers.GraniteMoeForCausalLM, config)


def test_granitemoe_greedy_matches_hf_with_chunked_prefill(granitemoe: tuple[Path, Any]) -> None:
    assert_greedy_matches(*granitemoe)


def test_granitemoe_layers_and_tensor_parallelism(granitemoe: tuple[Path, Any]) -> None:
    from troupe.gpu.moe_layer import MoeLayer
    from troupe.gpu.tp_model import TPDecoderModel
    from troupe.gpu.weights import load_model

    config, model = load_model(granitemoe[0], torch.float32, torch.device("cpu"), 64)
    assert config.granite is not None and config.granite.residual == 0.4
    assert config.moe is not None and config.moe.sparse_layers == (True, True)
    assert config.moe.top_k == 2 and config.moe.intermediate_size == 96
    assert all(isinstance(layer, MoeLayer) for layer in model.layers)
    with pytest.raises(ModelLoadError, match="granitemoe: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 0)  # type: ignore[arg-type]
