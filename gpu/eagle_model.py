"""An EAGLE-1 head (speculative_method="eagle"): vLLM's EagleLlamaForCausalLM, on our layers.

A head row at position p reads the token at p + 1 and the target's final hidden state at p
(gpu/target_hidden.py), and predicts the hidden state at p + 1, whose logits (the target's
lm_head) give the token at p + 2:

    x = fc(cat(embed(token[p+1]), hidden[p]))          fc: [H, 2H] (+ bias when shipped)
    x, residual = layer_0(x), with layer 0's input norm the identity (EAGLE-1 ships none;
                  a checkpoint that has one gets it), then layers 1.. as decoder layers
    out = x + residual                                  (norm(x + residual) when shipped)
    logits = target.lm_head(out); the next draft step feeds `out` as its hidden state

The head's attention runs over its own paged KV (one pool per head layer, indexed by the
target's block tables: gpu/eagle_runner.py) at the target's positions. Its embedding is its
own when the checkpoint ships one, else the target's. vLLM ignores a final norm in an EAGLE-1
checkpoint; here a shipped `norm.weight` is applied (then the head's output lives where the
target's normed hidden states do, which it is fed as its next input).
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.eagle_head_base import EagleHeadBase
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel, KVCache
from troupe.gpu.quant_linear import linear


class EagleHead(EagleHeadBase):
    """fc, the head's decoder layers and (optional) norms; logits through the target's lm_head."""

    def __init__(
        self,
        config: ModelConfig,
        target: DecoderModel,
        *,
        max_positions: int,
        fc_bias: bool = False,
        input_norm: bool = False,
        final_norm: bool = False,
        own_embedding: bool = False,
    ) -> None:
        super().__init__(config, target, max_positions=max_positions, own_embedding=own_embedding)
        h = config.hidden_size
        self.fc = self.param(h, 2 * h)
        self.fc_bias = self.param(h) if fc_bias else None
        self.has_input_norm = input_norm  # layer 0's: EAGLE-1 has none (the identity)
        if not input_norm:  # its parameter stays unread: ones rather than uninitialized memory
            with torch.no_grad():
                self.first_layer().input_layernorm.fill_(1.0)
        self.norm = self.param(h) if final_norm else None
        self.compute_logits = target.compute_logits

    def combine(self, taps: torch.Tensor) -> torch.Tensor:
        """The target's post-norm states as the forward's hidden input: as they are (fc
        runs in the forward, on every step's hidden state alike)."""
        return taps

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the logits read, what the next draft step is fed): the output, twice."""
        out: torch.Tensor = self(input_ids, positions, hidden, meta, kv_caches)
        return out, out

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """The head's output [N, hidden] of every row: row i reads input_ids[i] (the token
        after its position) and hidden[i] (the target's, or the head's own, at its position)."""
        c, ops = self.config, self.ops
        x = linear(torch.cat([self.embed(input_ids), hidden.to(self.dtype)], dim=-1), self.fc)
        if self.fc_bias is not None:
            x = x + self.fc_bias
        h = x  # EAGLE-1: no norm before the first attention
        if self.has_input_norm:
            h = ops.rms_norm(x, self.first_layer().input_layernorm, c.rms_norm_eps)[0]
        x, residual = self.run_layers(h, x, positions, meta, kv_caches)
        if self.norm is not None:
            out: torch.Tensor = ops.rms_norm(x, self.norm, c.rms_norm_eps, residual)[0]
            return out
        return x + residual
