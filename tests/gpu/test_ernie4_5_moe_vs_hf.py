"""ERNIE 4.5 MoE (ernie4_5_moe): ERNIE 4.5's attention (interleaved rotary over the whole head)
over experts routed by softmax with a correction bias (moe_statics), top-k renormalised, beside
shared experts, in the layers moe_layer_start_index..moe_layer_end_index every
moe_layer_interval. Greedy token-identical to HF transformers (fp32) through chunked prefill,
from the folder transformers saves; what config.json may not say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

TINY_ERNIE_MOE = {
    **TINY,
    "num_hidden_layers": 4,
    "head_dim": 16,
    "moe_intermediate_size": 24,
    "moe_num_experts": 8,
    "moe_k": 2,
    "moe_num_shared_experts": 1,
    "moe_layer_start_index": 1,
    "moe_layer_end_index": 2,  # the last layer is dense again
    "moe_layer_interval": 1,
    "rope_theta": 500.0,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def ernie_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("ernie4_5_moe")
    hf_model = saved_family(folder, "Ernie4_5_Moe", TINY_ERNIE_MOE)
    with torch.no_grad():  # a correction bias that changes the choice of experts
        for name, param in hf_model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                param.copy_(torch.linspace(-0.1, 0.1, param.numel()).flip(0).view_as(param))
    hf_model.save_pretrained(folder)
    return folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(ernie_moe: tuple[Path, Any]) -> None:
    assert_greedy_matches(*ernie_moe)


def test_the_layers_are_read_as_declared(ernie_moe: tuple[Path, Any]) -> None:
    from troupe.gpu.grouped_moe_layer import GroupedMoeLayer
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.models import DecoderLayer, DecoderModel

    config = ModelConfig.from_hf_folder(ernie_moe[0])
    assert config.moe is not None and config.moe.routing is not None
    assert config.moe.sparse_layers == (False, True, True, False)
    assert config.moe.routing.method == "softmax_bias" and config.moe.num_shared_experts == 1
    assert config.rope_interleaved and not config.qkv_bias and not config.tie_word_embeddings
    model = DecoderModel(config, torch.float32, torch.device("cpu"), 64)
    kinds = [DecoderLayer, GroupedMoeLayer, GroupedMoeLayer, DecoderLayer]
    assert [type(layer) for layer in model.layers] == kinds
    bias = model.layers[1].experts.correction_bias
    assert bias is not None and bias[0] > bias[-1]  # read from moe_statics, not left at zero


def test_the_correction_bias_steers_the_choice_only() -> None:
    """The bias picks the experts; the weights are the unbiased softmax scores, renormalised."""
    from troupe.kernels.moe_router import GroupedRouting, route_grouped

    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    routing = GroupedRouting(top_k=2, method="softmax_bias", norm_topk_prob=True)
    weights, ids = route_grouped(logits, routing, torch.tensor([0.0, 0.0, 0.0, 0.9]))
    assert ids.tolist() == [[0, 3]]
    scores = logits.softmax(dim=-1)[0]
    want = torch.stack([scores[0], scores[3]]) / (scores[0] + scores[3])
    assert torch.allclose(weights[0], want)


def test_config_json_errors_name_the_field() -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    base = {"model_type": "ernie4_5_moe", "num_attention_heads": 4, "hidden_size": 64,
            "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 256,
            "moe_intermediate_size": 24, "moe_num_experts": 4, "moe_k": 2}  # fmt: skip
    with pytest.raises(ModelLoadError, match="shared experts with use_bias are not supported"):
        ModelConfig.from_hf_dict({**base, "use_bias": True})
    with pytest.raises(ModelLoadError, match="moe_layer_interval must be >= 1"):
        ModelConfig.from_hf_dict({**base, "moe_layer_interval": 0})
    dense = ModelConfig.from_hf_dict({**base, "moe_layer_start_index": 5})
    assert dense.moe is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(ernie_moe: tuple[Path, Any]) -> None:
    assert_greedy_matches(*ernie_moe, device="cuda")
