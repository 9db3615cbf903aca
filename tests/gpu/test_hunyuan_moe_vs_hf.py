"""HunYuan MoE (transformers' HunYuanMoEV1ForCausalLM, Hunyuan-A13B): HunYuan dense's attention
(q / k normalised after the rotary, the moved base) over experts in every layer, routed in fp32
by a softmax top-k always renormalised (mlp.gate.wg), and an ungated MLP beside them
(mlp.shared_mlp). Greedy token-identical to HF transformers (fp32) through chunked prefill;
the same checkpoint without the MLP beside the experts answers otherwise; per-layer lists that
differ and tensor parallelism are refused by name; random weights load as a checkpoint's do."""

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
    "num_experts": 6,
    "moe_topk": [2, 2],  # per layer, as Hunyuan-A13B's config.json gives it
    "rope_parameters": {
        "rope_type": "dynamic",
        "alpha": 1000.0,
        "rope_theta": 10000.0,
        "factor": 1.0,
    },
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("hunyuan_moe")
    return folder, saved_family(folder, "HunYuanMoEV1", SETTINGS)


def test_greedy_matches_hf_with_chunked_prefill(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved, device="cuda")


def test_the_config_reads_experts_and_the_mlp_beside_them(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    cfg = json.loads((saved[0] / "config.json").read_text())
    config = ModelConfig.from_hf_dict(cfg)
    moe = config.moe
    assert moe is not None and (moe.num_experts, moe.top_k, moe.intermediate_size) == (6, 2, 48)
    assert moe.sparse_layers == (True, True) and moe.norm_topk_prob
    assert moe.plain_shared_size == 48 and moe.gated_shared_size == 0
    assert config.qk_norm and config.scales_queries
    assert config.rope_theta == pytest.approx(10000.0 * 1000.0 ** (16 / 14))
    two = ModelConfig.from_hf_dict(
        {**cfg, "num_shared_expert": [2, 2], "moe_intermediate_size": 24}
    )
    assert two.moe is not None and two.moe.plain_shared_size == 96
    assert two.moe.intermediate_size == 24
    alone = ModelConfig.from_hf_dict({**cfg, "use_mixed_mlp_moe": False})
    assert alone.moe is not None and alone.moe.plain_shared_size == 0
    with pytest.raises(ModelLoadError, match=r"moe_topk must be one number.*\[2, 4\]"):
        ModelConfig.from_hf_dict({**cfg, "moe_topk": [2, 4]})
    with pytest.raises(ModelLoadError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict({**cfg, "moe_topk": 7})
    with pytest.raises(ModelLoadError, match="use_cla"):
        ModelConfig.from_hf_dict({**cfg, "use_cla": True})


def test_the_mlp_beside_the_experts_is_read(saved: tuple[Path, Any], tmp_path: Path) -> None:
    """Without it (use_mixed_mlp_moe off, its tensors dropped) the tokens differ."""
    folder, hf_model = saved
    cfg = json.loads((folder / "config.json").read_text())
    assert_edit_matters(
        folder,
        hf_model,
        tmp_path,
        lambda tensors: {k: v for k, v in tensors.items() if "shared_mlp" not in k},
        {**cfg, "use_mixed_mlp_moe": False},
    )


def test_random_weights_load_and_tensor_parallelism_is_refused(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.hunyuan_layer import HunyuanMoeLayer
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.models import DecoderModel
    from troupe.gpu.tp_model import TPDecoderModel
    from troupe.gpu.weight_fill import fill_weights
    from troupe.gpu.weights import random_weights

    config = ModelConfig.from_hf_folder(saved[0])
    model = DecoderModel(config, torch.float32, torch.device("cpu"), 64)
    fill_weights(model, random_weights(config, torch.float32, 0).items(), "random")
    layer = model.layers[1]
    assert isinstance(layer, HunyuanMoeLayer) and layer.router.dtype == torch.float32
    assert layer.gate_up_proj.shape == (96, 64) and layer.w13.shape == (6, 96, 64)
    with pytest.raises(ModelLoadError, match="hunyuan_v1_moe: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 1)  # type: ignore[arg-type]
