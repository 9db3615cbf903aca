"""Mixture-of-experts layers under tensor parallelism: each expert's rows cut, or whole experts
per rank (vLLM's enable_expert_parallel).

    intermediate cut (default)  every rank holds every expert's gate and up rows
                                [r*I/P, (r+1)*I/P) and the same columns of down; silu(gate) * up
                                is per row, so the rank's slice gives a partial sum of down
    expert parallel             rank r holds experts [r*E/P, (r+1)*E/P) whole; a token's slot
                                routed to another rank's expert goes to the rank's first expert
                                with weight 0, so it adds nothing

    router   whole on every rank: the same hidden rows give the same top-k everywhere
    output   each rank's partial sums, all-reduced after the experts (TPDecoderLayer.mlp)

Expert parallelism keeps the shapes fixed (CUDA graphs capture the step): every rank runs all
T*k rows through its experts, the foreign ones for nothing. Dropping them needs the fused
kernel's row sort (kernels/moe_align.py) to skip ids it does not hold: not built.

Checkpoints name experts one by one (mlp.experts.<e>.gate_proj.weight, ...) or fused as
transformers 5 holds them (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
[E, H, I]); `moe_targets` reads the rank's slices of either.
"""

from __future__ import annotations

from typing import Protocol

import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.moe_layer import MoeLayer
from troupe.gpu.tp_model import Target, TPDecoderLayer, TPShard


class TPMoeLayer(TPDecoderLayer, MoeLayer):
    """An MoE layer over the rank's experts (or expert rows); mlp() all-reduces the sum."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        layer_index: int,
        *,
        shard: TPShard,
    ) -> None:
        super().__init__(
            config, dtype, device, layer_index, num_local_experts=shard.num_local_experts
        )
        self.rank_shard = shard

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rank_routing(super().route(x), self.rank_shard)


def rank_routing(
    routing: tuple[torch.Tensor, torch.Tensor], shard: TPShard
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's (weights, ids) as the rank's experts read them: as they are when each
    rank holds every expert's rows, else `local_routing` over the rank's experts."""
    if not shard.expert_parallel:
        return routing
    return local_routing(*routing, shard.first_expert, shard.num_local_experts)


def local_routing(
    weights: torch.Tensor, ids: torch.Tensor, first: int, num_local: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing of experts [first, first + num_local) in local ids: other experts' slots
    get weight 0 and local id 0 (fixed shapes; they add nothing to the sum)."""
    local = ids - first
    owned = (local >= 0) & (local < num_local)
    return weights.masked_fill(~owned, 0), torch.where(owned, local, torch.zeros_like(local))


class ExpertWeights(Protocol):
    """A rank's router and experts (TPMoeLayer, DeepSeek's TPDeepseekMoe)."""

    @property
    def router(self) -> torch.Tensor: ...

    @property
    def w13(self) -> torch.Tensor: ...

    @property
    def w2(self) -> torch.Tensor: ...


def moe_targets(
    layer: ExpertWeights, prefix: str, shard: TPShard, *, fused: bool
) -> list[tuple[str, Target]]:
    """(checkpoint name, target) of every expert weight of the layer on this rank; `prefix`
    is 'model.layers.<i>.'; `fused`: the checkpoint holds gate_up_proj / down_proj whole."""
    assert shard.full.moe is not None
    inter = shard.full.moe.intermediate_size
    ni = shard.expert_intermediate_size
    i0 = 0 if shard.expert_parallel else shard.rank * ni
    e0, ne = shard.first_expert, shard.num_local_experts
    w13, w2 = layer.w13, layer.w2
    targets: list[tuple[str, Target]] = [(prefix + "mlp.gate.weight", (layer.router, None, 0, 0))]
    if fused:
        gate_up, down = prefix + "mlp.experts.gate_up_proj", prefix + "mlp.experts.down_proj"
        if shard.expert_parallel:
            targets += [(gate_up, (w13, 0, e0, e0 + ne)), (down, (w2, 0, e0, e0 + ne))]
            return targets
        targets += [
            (gate_up, (w13[:, :ni], 1, i0, i0 + ni)),
            (gate_up, (w13[:, ni:], 1, inter + i0, inter + i0 + ni)),
            (down, (w2, 2, i0, i0 + ni)),
        ]
        return targets
    for local in range(ne):
        p = f"{prefix}mlp.experts.{e0 + local}."
        targets += [
            (p + "gate_proj.weight", (w13[local, :ni], 0, i0, i0 + ni)),
            (p + "up_proj.weight", (w13[local, ni:], 0, i0, i0 + ni)),
            (p + "down_proj.weight", (w2[local], 1, i0, i0 + ni)),
        ]
    return targets
