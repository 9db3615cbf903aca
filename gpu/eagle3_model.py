"""An EAGLE-3 head (vLLM's Eagle3LlamaForCausalLM, llama_eagle3.py), on our layers.

A head row at position p reads the token at p + 1 and the target's residual stream at p in
the tapped layers (gpu/target_hidden.py), and predicts the token at p + 2:

    h = fc(cat(s_a, s_b, s_c))              fc: [H, 3T], once, on the target's states (each
                                            T wide: target_hidden_size, default H)
    layer 0: x = cat(input_layernorm(embed(token[p+1])), hidden_norm(h))   width 2H:
             qkv_proj has 2H inputs; residual = h (hidden_norm(h) with norm_before_residual)
             attention, post_attention_layernorm(+ residual), MLP as a decoder layer
    layers 1..: decoder layers (width H)
    normed, prenorm = norm(x + residual), x + residual
    logits = lm_head(normed) over the draft vocabulary, placed at target ids d + d2t[d]
             (-inf elsewhere); the next draft step feeds `prenorm` as its h (no fc again)

Its attention runs over its own paged KV at the target's positions, as an EAGLE-1 head's
(gpu/eagle_model.py). Its embedding is its own when the checkpoint ships one, else the
target's (then T = H: gpu/eagle3_load.py refuses the rest). Past fc everything is H wide.
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.eagle_head_base import EagleHeadBase
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel, KVCache
from troupe.gpu.quant_linear import linear


class Eagle3Head(EagleHeadBase):
    """fc, the head's layers (layer 0 over 2H), its norm and its lm_head over draft ids."""

    def __init__(
        self,
        config: ModelConfig,
        target: DecoderModel,
        *,
        max_positions: int,
        num_taps: int,
        draft_vocab_size: int,
        target_hidden_size: int | None = None,
        norm_before_residual: bool = False,
        own_embedding: bool = False,
    ) -> None:
        super().__init__(config, target, max_positions=max_positions, own_embedding=own_embedding)
        c, h = config, config.hidden_size
        self.target_hidden_size = target_hidden_size or h  # each tapped state's width
        self.fc = self.param(h, num_taps * self.target_hidden_size)
        self.first_layer().qkv_proj = self.param(c.q_size + 2 * c.kv_size, 2 * h)  # cat(e, h)
        self.hidden_norm = self.param(h)
        self.norm_before_residual = norm_before_residual
        self.norm = self.param(h)
        self.lm_head = self.param(draft_vocab_size, h)
        self.vocab_size = c.vocab_size  # the target's: logits are placed there
        # draft id d -> target id d + d2t[d] (the identity until a checkpoint's d2t is read)
        self.register_buffer(
            "draft_to_target", torch.arange(draft_vocab_size, device=self.device), persistent=False
        )

    def combine(self, taps: torch.Tensor) -> torch.Tensor:
        """The target's tapped states [N, 3T] as the head's hidden input [N, H]: fc."""
        return linear(taps.to(self.dtype), self.fc)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed, prenorm) [N, H] of every row: row i reads input_ids[i] (the token after
        its position) and hidden[i] (fc of the target's states, or the head's own prenorm)."""
        c, ops, eps = self.config, self.ops, self.config.rms_norm_eps
        embeds = ops.rms_norm(self.embed(input_ids), self.first_layer().input_layernorm, eps)[0]
        normed_hidden = ops.rms_norm(hidden, self.hidden_norm, eps)[0]
        residual = normed_hidden if self.norm_before_residual else hidden
        x = torch.cat([embeds, normed_hidden], dim=-1)
        x, residual = self.run_layers(x, residual, positions, meta, kv_caches)
        normed, prenorm = ops.rms_norm(x, self.norm, c.rms_norm_eps, residual)
        return normed, prenorm

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the logits read, what the next draft step is fed): (normed, prenorm)."""
        normed, prenorm = self(input_ids, positions, hidden, meta, kv_caches)
        return normed, prenorm

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, target vocab]: the draft vocabulary's at their target ids, -inf at the
        others (as vLLM's), so draws over the target's ids never pick an unmapped one."""
        draft = linear(hidden, self.lm_head).to(self.logits_dtype)
        logits = draft.new_full((len(hidden), self.vocab_size), float("-inf"))
        logits[:, self.get_buffer("draft_to_target")] = draft
        return logits
