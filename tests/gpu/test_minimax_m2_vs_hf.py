"""MiniMax-M2 (transformers' MiniMaxM2ForCausalLM): q / k RMS-normalised across all heads
before a partial rotary (rotary_dim 8 of 16 here, as M2's 64 of 128), experts in every layer
routed by sigmoid scores with a correction bias (the top-k renormalised), Mixtral's names on
disk. Greedy token-identical to HF transformers (fp32) through chunked prefill, the norm weights
and the bias drawn away from 1 and 0; the same checkpoint with the bias zeroed answers
otherwise; what troupe does not run is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_edit_matters, assert_greedy_matches, saved_family

SETTINGS = {
    **TINY,
    "head_dim": 16,
    "intermediate_size": 48,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "rotary_dim": 8,
    # what transformers >= 5.2x derives from rotary_dim; older ones (the device image's 5.17)
    # read only this, and would rotate whole heads
    "partial_rotary_factor": 0.5,
    "rope_theta": 1000.0,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("minimax_m2")
    hf_model = saved_family(folder, "MiniMaxM2", SETTINGS)
    with torch.no_grad():  # transformers starts the bias at 0: draw it, so a lost one shows
        for layer in hf_model.model.layers:
            layer.mlp.e_score_correction_bias.uniform_(-0.5, 0.5)
    hf_model.save_pretrained(folder)
    return folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved, device="cuda")


def test_the_correction_bias_is_read(saved: tuple[Path, Any], tmp_path: Path) -> None:
    def zeroed(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: torch.zeros_like(v) if "correction_bias" in k else v for k, v in tensors.items()}

    assert_edit_matters(*saved, tmp_path, zeroed)


def test_the_config(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    cfg = json.loads((saved[0] / "config.json").read_text())
    config = ModelConfig.from_hf_dict(cfg)
    moe = config.moe
    assert moe is not None and moe.routing is not None and moe.routing.method == "noaux_tc"
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (8, 2, 48)
    assert config.rotary_dim == 8 and not config.qk_norm
    # the hub's config.json names rotary_dim alone (transformers 4's spelling)
    hub = {k: v for k, v in cfg.items() if k != "rope_parameters"} | {"rope_theta": 1000.0}
    assert ModelConfig.from_hf_dict(hub).rotary_dim == 8
    for change, named in (
        ({"scoring_func": "softmax"}, "scoring_func"),
        ({"shared_intermediate_size": 64}, "shared_intermediate_size"),
        ({"qk_norm_type": "per_head"}, "qk_norm_type"),
    ):
        with pytest.raises(ModelLoadError, match=named):
            ModelConfig.from_hf_dict({**cfg, **change})
    with pytest.raises(ModelLoadError, match="minimax_m2: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 1)  # type: ignore[arg-type]
