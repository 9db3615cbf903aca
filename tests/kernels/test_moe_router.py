"""DeepSeek's grouped routers against transformers' DeepseekV2/V3 router modules."""

from __future__ import annotations

import pytest
import torch
from troupe.kernels.moe_router import GroupedRouting, route_grouped

SHAPE = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 64}


def _check(hf_router, routing: GroupedRouting, bias: torch.Tensor | None) -> None:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hf_router.weight.copy_(torch.randn(hf_router.weight.shape, generator=gen))
        x = torch.randn(40, 32, generator=gen)
        _, hf_weights, hf_ids = hf_router(x)
        weights, ids = route_grouped(torch.nn.functional.linear(x, hf_router.weight), routing, bias)
    hf_ids, order = hf_ids.sort(dim=-1)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights.gather(1, order))


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2_router(method: str) -> None:
    import transformers
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    cfg = transformers.DeepseekV2Config(
        **SHAPE, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
        topk_method=method, routed_scaling_factor=1.5,
    )  # fmt: skip
    routing = GroupedRouting(
        top_k=3, num_groups=4, topk_groups=2, method=method, routed_scaling_factor=1.5
    )
    _check(DeepseekV2TopkRouter(cfg), routing, None)


def test_deepseek_v3_router_with_correction_bias() -> None:
    import transformers
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = transformers.DeepseekV3Config(
        **SHAPE, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5,
    )  # fmt: skip
    router = DeepseekV3TopkRouter(cfg)
    bias = torch.linspace(-0.3, 0.3, 16)
    router.e_score_correction_bias.copy_(bias)
    routing = GroupedRouting(
        top_k=4, num_groups=4, topk_groups=2, method="noaux_tc", norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )  # fmt: skip
    _check(router, routing, bias)
    # the groups matter: without the group limit other experts win for some tokens
    free = GroupedRouting(top_k=4, num_groups=1, topk_groups=1, method="noaux_tc")
    logits = torch.randn(40, 16, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(
        route_grouped(logits, free, bias)[1], route_grouped(logits, routing, bias)[1]
    )


def test_bad_routing_names_the_field() -> None:
    with pytest.raises(ValueError, match="topk_method"):
        GroupedRouting(top_k=2, method="random")
    with pytest.raises(ValueError, match="topk_group"):
        GroupedRouting(top_k=2, num_groups=2, topk_groups=3)
