"""The mixture-of-experts fields of an HF config.json (Qwen3-MoE, Mixtral), read into a
MoeConfig.

    qwen3_moe   num_experts (or num_local_experts), num_experts_per_tok, moe_intermediate_size,
                norm_topk_prob; layer i is sparse unless i is in mlp_only_layers or
                (i + 1) % decoder_sparse_step != 0; dense layers use intermediate_size.
    mixtral     num_local_experts, num_experts_per_tok; every layer sparse, each expert
                intermediate_size wide; the top-k always renormalised (transformers'
                MixtralTopKRouter)

The router is a softmax over every expert in fp32, the top-k of it, renormalised to sum 1 when
norm_topk_prob, then cast to the activations' dtype (transformers' Qwen3MoeTopKRouter).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from troupe.kernels.moe_router import GroupedRouting


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeConfig:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP
    num_shared_experts: int = 0  # DeepSeek: an MLP every token runs (gpu/deepseek_config.py)
    routing: GroupedRouting | None = None  # DeepSeek's grouped routers; None: softmax top-k

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(
                f"config.json: num_experts_per_tok ({self.top_k}) must be in 1..num_experts "
                f"({self.num_experts})"
            )
        if self.intermediate_size <= 0:
            raise ValueError("config.json: moe_intermediate_size must be positive")


def qwen3_moe_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig | None:
    """The MoeConfig of a qwen3_moe config.json; None when it has no experts (all dense)."""
    num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    step = int(cfg.get("decoder_sparse_step", 1))
    if step <= 0:
        raise ValueError(f"config.json: decoder_sparse_step must be >= 1; got {step}")
    dense_only = {int(i) for i in cfg.get("mlp_only_layers") or ()}
    sparse = tuple(
        num_experts > 0 and i not in dense_only and (i + 1) % step == 0 for i in range(num_layers)
    )
    if not any(sparse):
        return None
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        if key not in cfg:
            raise ValueError(f"config.json: missing required key {key!r} for qwen3_moe")
    return MoeConfig(
        num_experts=num_experts,
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_layers=sparse,
    )


def mixtral_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig:
    """The MoeConfig of a mixtral config.json: experts in every layer."""
    for key in ("num_local_experts", "num_experts_per_tok"):
        if key not in cfg:
            raise ValueError(f"config.json: missing required key {key!r} for mixtral")
    return MoeConfig(
        num_experts=int(cfg["num_local_experts"]),
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate_size=int(cfg["intermediate_size"]),
        norm_topk_prob=True,
        sparse_layers=(True,) * num_layers,
    )
