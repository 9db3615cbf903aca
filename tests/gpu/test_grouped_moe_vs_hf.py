"""The families whose sparse layers are gpu/grouped_moe_layer.py's (DeepSeek-V3-style routed and
shared experts under a Llama-shaped attention), each greedy token-identical to HF transformers
(fp32) through chunked prefill, from the folder transformers saves, with a correction bias that
changes the choice of experts; tensor parallelism is refused by name.

    glm4_moe      GLM-4.5: q/k/v biases, per-head q/k norms, RoPE on half of each head; sigmoid
                  routing over groups, routed_scaling_factor, a dense first layer
    dots1         dots.llm1: Qwen3's attention (q/k norms) over the same experts; Qwen2-style
                  windows from max_window_layers on
    ernie4_5_moe  ERNIE 4.5: interleaved rotary over the whole head; softmax routing with the
                  moe_statics correction bias, experts within moe_layer_start..end_index
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

GROUPED = {
    **TINY,
    "num_hidden_layers": 3,
    "head_dim": 16,
    "moe_intermediate_size": 24,
    "rope_theta": 100.0,
}
DEEPSEEK_EXPERTS = {
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
}
# name: (transformers' class prefix, settings, sparse layers, routing method)
FAMILIES: dict[str, tuple[str, dict[str, Any], tuple[bool, ...], str]] = {
    "glm4_moe": (
        "Glm4Moe",
        {
            **GROUPED,
            **DEEPSEEK_EXPERTS,
            "use_qk_norm": True,
            "attention_bias": True,
            "partial_rotary_factor": 0.5,
        },
        (False, True, True),
        "noaux_tc",
    ),
    "dots1": (
        "Dots1",
        {**GROUPED, **DEEPSEEK_EXPERTS, "sliding_window": 5, "max_window_layers": 2},
        (False, True, True),
        "noaux_tc",
    ),
    "ernie4_5_moe": (
        "Ernie4_5_Moe",
        {
            **GROUPED,
            "num_hidden_layers": 4,
            "moe_num_experts": 8,
            "moe_k": 2,
            "moe_num_shared_experts": 1,
            "moe_layer_start_index": 1,
            "moe_layer_end_index": 2,
            "rope_theta": 500.0,
            "tie_word_embeddings": False,
        },
        (False, True, True, False),  # the last layer is past moe_layer_end_index: dense
        "softmax_bias",
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    prefix, settings, _, _ = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    hf_model = saved_family(folder, prefix, settings)
    with torch.no_grad():  # a correction bias that changes the choice of experts
        for name, tensor in hf_model.state_dict().items():
            if name.endswith("e_score_correction_bias"):
                tensor.copy_(torch.linspace(-0.3, 0.3, tensor.numel()).flip(0).view_as(tensor))
    hf_model.save_pretrained(folder)
    return request.param, folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:])


def test_the_layers_are_read_as_declared(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.grouped_moe_layer import GroupedMoeLayer
    from troupe.gpu.models import DecoderLayer
    from troupe.gpu.weights import load_model

    name, folder, _ = family
    _, _, sparse, method = FAMILIES[name]
    config, model = load_model(folder, torch.float32, torch.device("cpu"), 64)
    assert config.moe is not None and config.moe.routing is not None
    assert config.moe.sparse_layers == sparse and config.moe.routing.method == method
    assert config.moe.num_shared_experts == 1
    kinds = [GroupedMoeLayer if s else DecoderLayer for s in sparse]
    assert [type(layer) for layer in model.layers] == kinds
    bias = model.layers[1].experts.correction_bias
    assert bias is not None and bias[0] > bias[-1]  # read from the checkpoint, not left at zero
    facts = {
        "glm4_moe": (config.rope_dim == 8, config.qk_norm, config.qkv_bias, not config.o_bias),
        "dots1": (config.qk_norm, not config.qkv_bias, config.layer_windows == (0, 0, 5)),
        "ernie4_5_moe": (config.rope_interleaved, not config.qkv_bias),
    }[name]
    assert all(facts), facts
    routing = config.moe.routing
    assert routing.routed_scaling_factor == (1.0 if name == "ernie4_5_moe" else 2.5)


def test_tensor_parallelism_is_refused(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    name, folder, _ = family
    config = ModelConfig.from_hf_folder(folder)
    with pytest.raises(ModelLoadError, match=f"{name}: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 1)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:], device="cuda")


def test_ernie_routing_biases_the_choice_only() -> None:
    """softmax_bias: the bias picks the experts; the weights are the unbiased softmax scores,
    renormalised."""
    from troupe.kernels.moe_router import GroupedRouting, route_grouped

    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    routing = GroupedRouting(top_k=2, method="softmax_bias", norm_topk_prob=True)
    weights, ids = route_grouped(logits, routing, torch.tensor([0.0, 0.0, 0.0, 0.9]))
    assert ids.tolist() == [[0, 3]]
    scores = logits.softmax(dim=-1)[0]
    want = torch.stack([scores[0], scores[3]]) / (scores[0] + scores[3])
    assert torch.allclose(weights[0], want)


def test_ernie_config_errors_name_the_field() -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    base = {"model_type": "ernie4_5_moe", "num_attention_heads": 4, "hidden_size": 64,
            "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 256,
            "moe_intermediate_size": 24, "moe_num_experts": 4, "moe_k": 2}  # fmt: skip
    with pytest.raises(ModelLoadError, match="shared experts with use_bias are not supported"):
        ModelConfig.from_hf_dict({**base, "use_bias": True})
    with pytest.raises(ModelLoadError, match="moe_layer_interval must be >= 1"):
        ModelConfig.from_hf_dict({**base, "moe_layer_interval": 0})
    assert ModelConfig.from_hf_dict({**base, "moe_layer_start_index": 5}).moe is None
