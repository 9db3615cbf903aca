"""LoRA adapters on a tensor-parallel rank: each rank holds its cut of every adapter, as
vLLM's ColumnParallelLinearWithLoRA / MergedQKVParallelLinearWithLoRA /
RowParallelLinearWithLoRA do.

A targeted projection computes y = W x + B (A x) (B already scaled, gpu/lora_adapter.py).

    column-parallel   q/k/v, gate/up   rank r holds W's rows R_r, and y[R_r] = W[R_r] x +
                                       B[R_r] (A x): A whole, B's rows of the rank's output
                                       shard (its heads, its KV heads (replicated ones too),
                                       its intermediate rows)
    row-parallel      o, down          rank r holds W's columns C_r and the input x[C_r]; the
                                       partial sums are all-reduced (gpu/tp_model.py), so the
                                       delta is added before it: sum_r B (A[:, C_r] x[C_r]) =
                                       B (A x). A's columns C_r, B whole

The cut is an ordinary adapter over the rank's layer shapes (TPShard.layer_config), so the
slots, the masked / one slot / off modes and the CUDA graphs (gpu/lora_linear.py,
gpu/lora_runtime.py) run on it unchanged.
"""

from __future__ import annotations

import dataclasses

import torch
from troupe.config import EngineConfig
from troupe.gpu.lora_adapter import LoraAdapter
from troupe.gpu.lora_runtime import LoraRuntime, install_lora
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.runner_setup import is_large_gpu
from troupe.gpu.tp_model import TPDecoderModel, TPShard


@dataclasses.dataclass(frozen=True)
class TPLoraSharding:
    """What rank `shard.rank` holds of each adapter (LoraSharding, gpu/lora_runtime.py)."""

    tp: TPShard

    @property
    def layer_config(self) -> ModelConfig:
        return self.tp.layer_config()

    def ranges(self) -> dict[str, tuple[int, int, int]]:
        """PEFT module -> (dim of its factors cut: 0 B's rows, 1 A's columns; start, stop)."""
        tp, hd = self.tp, self.tp.full.head_dim
        q0, nq = tp.first_head * hd, tp.num_heads * hd
        k0, nk = tp.first_kv_head * hd, tp.num_kv_heads * hd
        i0, ni = tp.rank * tp.intermediate_size, tp.intermediate_size
        return {
            "q_proj": (0, q0, q0 + nq),
            "k_proj": (0, k0, k0 + nk),
            "v_proj": (0, k0, k0 + nk),
            "gate_proj": (0, i0, i0 + ni),
            "up_proj": (0, i0, i0 + ni),
            "o_proj": (1, q0, q0 + nq),
            "down_proj": (1, i0, i0 + ni),
        }

    def shard(self, adapter: LoraAdapter) -> LoraAdapter:
        ranges = self.ranges()
        weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for (layer, module), (a, b) in adapter.weights.items():
            dim, start, stop = ranges[module]
            if dim == 0:  # column-parallel: B's rows of the rank's outputs
                b = b[start:stop]
            else:  # row-parallel: A's columns of the rank's inputs
                a = a[:, start:stop]
            weights[(layer, module)] = (a.contiguous(), b.contiguous())
        return dataclasses.replace(adapter, weights=weights)


def install_tp_lora(model: TPDecoderModel, config: EngineConfig) -> LoraRuntime | None:
    """The engine's adapters (lora_modules) on this rank's model, checked against the whole
    model and held as the rank's cut; None without LoRA. The token buffer is the one
    runner_setup sizes for an unsharded model."""
    if not (config.lora_modules or config.enable_lora):
        return None
    most = config.step_budget(is_large_gpu(config))
    most += config.max_num_seqs * (1 + config.num_proposals)  # merged, verified steps
    return install_lora(
        model,
        model.shard.full,
        config.lora_adapters,
        max_loras=config.max_loras,
        max_rank=config.max_lora_rank,
        max_tokens=most,
        wrap_all=config.enable_lora,
        sharding=TPLoraSharding(model.shard),
        kernel=config.lora_kernel,
    )
