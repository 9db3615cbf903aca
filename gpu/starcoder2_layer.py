"""StarCoder2's decoder layer (transformers' Starcoder2DecoderLayer): Llama's pre-norm layer
with LayerNorms that add a bias (gpu/layer_norm.py) and an MLP without a gate,

    h = h + attention(norm_1(h))          (q/k/v and o with biases: use_bias)
    h = h + c_proj(gelu_tanh(c_fc(norm_2(h))))

The stream is carried as the plain layer carries it (the norm adds the residual first). c_proj
is the plain layer's down projection (down_proj, down_bias); c_fc takes the place of its
gate|up matrix, which this layer does not have.

Nemotron's layer (transformers' NemotronDecoderLayer: Minitron, Nemotron-4) is the same with
other names (mlp.up_proj, mlp.down_proj), relu(x)^2 for the GELU, and LayerNorm1P norms,
whose weight is shipped less 1 (the loader adds it back, as for Gemma's norms).

Arcee's (AFM-4.5B: transformers' Llama layer over NemotronMLP) keeps Llama's RMSNorms and
takes only the MLP without a gate (`UngatedMlpLayer`), under Nemotron's names, with its
squared ReLU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.layer_norm import layer_norm
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, KVCache, new_param
from troupe.gpu.quant_linear import linear
from troupe.kernels.ops import KernelOps

# the checkpoint's names -> this layer's parameters: the norms' biases, then each MLP's names
_NORM_BIASES = {
    "input_layernorm.bias": "input_norm_bias",
    "post_attention_layernorm.bias": "post_norm_bias",
}


def _names(up: str, down: str) -> dict[str, str]:
    mlp = {f"mlp.{up}.weight": "c_fc", f"mlp.{up}.bias": "c_fc_bias"}
    return mlp | {f"mlp.{down}.weight": "down_proj", f"mlp.{down}.bias": "down_bias"}


UP_DOWN = _names("up_proj", "down_proj")
_STARCODER2 = _names("c_fc", "c_proj") | _NORM_BIASES
_NEMOTRON = UP_DOWN | _NORM_BIASES


class UngatedMlpLayer(DecoderLayer):
    """The plain layer with an MLP without a gate: c_fc -> activation -> down_proj."""

    names = UP_DOWN  # the checkpoint's names of this layer's own parameters

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        c = config
        for name in ("gate_up_proj", "gate_up_bias"):
            delattr(self, name)  # no gate: c_fc is the MLP's one input matrix
            setattr(self, name, None)
        self.c_fc = new_param(c.intermediate_size, c.hidden_size, dtype=dtype, device=device)
        self.c_fc_bias = None
        if c.mlp_bias:
            self.c_fc_bias = new_param(c.intermediate_size, dtype=dtype, device=device)

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        up = self.activation(linear(x, self.c_fc, self.c_fc_bias))
        return linear(up, self.down_proj, self.down_bias)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """ModelConfig.hidden_act: StarCoder2's tanh GELU, Nemotron's and Arcee's squared
        ReLU."""
        if self.config.hidden_act == "relu2":
            return torch.square(F.relu(x))
        return F.gelu(x, approximate="tanh")

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The MLP (and the norms' biases) under the family's own names."""
        name = self.names.get(rest)
        found = None if name is None else getattr(self, name)
        if found is None:  # not one of them, or a bias the config leaves out
            return super().locate_extra(rest, prefix)
        return found, (f"{prefix}.{name}",)


class Starcoder2Layer(UngatedMlpLayer):
    """The layer above: biased LayerNorms, and c_fc -> tanh GELU -> c_proj."""

    names = _STARCODER2

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        self.input_norm_bias = new_param(config.hidden_size, dtype=dtype, device=device)
        self.post_norm_bias = new_param(config.hidden_size, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        cos_sin: torch.Tensor,
        ops: KernelOps,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.config.rms_norm_eps
        x, residual = layer_norm(hidden, self.input_layernorm, eps, residual, self.input_norm_bias)
        hidden = self.attention(x, positions, meta, kv_cache, cos_sin, ops)
        x, residual = layer_norm(
            hidden, self.post_attention_layernorm, eps, residual, self.post_norm_bias
        )
        return self.mlp(x, ops), residual


class NemotronLayer(Starcoder2Layer):
    """Nemotron's names (its squared ReLU: hidden_act; its LayerNorm1P weights: the loader's
    +1)."""

    names = _NEMOTRON
