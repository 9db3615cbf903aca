"""DeepSeek's multi-token-prediction (MTP) layer as a draft head (speculative_method="mtp"):
vLLM's DeepSeekMultiTokenPredictorLayer (deepseek_mtp.py), SGLang's NEXTN, on our layers.

A row at position p reads the token at p + 1 and the target's final (post-norm) hidden state
at p, as vLLM passes it (gpu/target_hidden.py, EAGLE-1's taps), and predicts the token at p + 2:

    e   = embed(token[p+1]), zero at position 0 (vLLM and SGLang mask that row's embedding)
    x   = eh_proj(cat(enorm(e), hnorm(hidden[p])))            eh_proj: [H, 2H], no bias
    out = x + residual after the decoder layer (MLA + dense or MoE MLP: gpu/mla_layer.py,
          layer num_hidden_layers of the checkpoint, over its own paged KV)
    logits = head(shared_head.norm(out)); head: shared_head.head, else the model's lm_head

The next draft step feeds `out` as its hidden state (through hnorm and eh_proj again): the one
layer proposes k tokens autoregressively, as vLLM runs it. Its embedding is the model's unless
the checkpoint ships another (gpu/mtp_load.py shares a shipped copy that equals the model's).
"""

from __future__ import annotations

import torch
from torch import nn
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.mla_layer import MlaLayer
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel, KVCache, new_param, set_layer_kv_scales
from troupe.gpu.quant_linear import embedding, linear


class MtpHead(nn.Module):
    """enorm, hnorm, eh_proj, one MlaLayer and the shared head; a DraftHead (eagle_load.py)."""

    def __init__(
        self,
        config: ModelConfig,
        target: DecoderModel,
        *,
        own_embedding: bool = False,
        own_head: bool = False,
    ) -> None:
        super().__init__()
        c, dtype, device = config, target.dtype, target.device
        assert c.mla is not None and c.num_layers == 1, "one DeepSeek layer (gpu/mtp_load.py)"
        self.config = c
        self.dtype = dtype
        self.device = device
        self.ops = target.ops
        h = c.hidden_size

        def param(*shape: int) -> nn.Parameter:
            return new_param(*shape, dtype=dtype, device=device)

        self.layers = nn.ModuleList([MlaLayer(c, dtype, device, 0)])
        self.enorm = param(h)
        self.hnorm = param(h)
        self.eh_proj = param(h, 2 * h)
        self.shared_norm = param(h)  # shared_head.norm
        self.shared_head = param(c.vocab_size, h) if own_head else None
        self.embed_tokens = param(c.vocab_size, h) if own_embedding else None
        # not submodules: the target's weights and rotary table stay the target's (no copy)
        self._target_embed = target.embed
        self._target_logits = target.compute_logits
        self._cos_sin = target.get_buffer("cos_sin_cache")  # same rope and positions

    @property
    def layer(self) -> MlaLayer:
        layer = self.layers[0]
        assert isinstance(layer, MlaLayer)
        return layer

    def set_kv_scales(self, scales: torch.Tensor | None) -> None:
        set_layer_kv_scales(self.layers, scales)

    def combine(self, taps: torch.Tensor) -> torch.Tensor:
        """The target's post-norm states, as they are (hnorm and eh_proj run in the forward,
        on the target's states and the layer's own alike)."""
        return taps

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is None:
            return self._target_embed(input_ids)
        return embedding(input_ids, self.embed_tokens, self.dtype)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """`out` [N, H] of every row: row i reads input_ids[i] (the token after its position)
        and hidden[i] (the target's post-norm state there, or this layer's own `out`)."""
        ops, eps = self.ops, self.config.rms_norm_eps
        e = self.embed(input_ids)
        e = torch.where((positions == 0)[:, None], torch.zeros_like(e), e)
        e = ops.rms_norm(e, self.enorm, eps)[0]
        h = ops.rms_norm(hidden.to(self.dtype), self.hnorm, eps)[0]
        x = linear(torch.cat([e, h], dim=-1), self.eh_proj)
        x, residual = self.layer(x, None, positions, meta, kv_caches[0], self._cos_sin, ops)
        out: torch.Tensor = x + residual
        return out

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the logits read, what the next draft step is fed): `out`, twice."""
        out: torch.Tensor = self(input_ids, positions, hidden, meta, kv_caches)
        return out, out

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab]: the shared head over shared_head.norm(out)."""
        normed = self.ops.rms_norm(hidden, self.shared_norm, self.config.rms_norm_eps)[0]
        if self.shared_head is None:
            return self._target_logits(normed)
        return linear(normed, self.shared_head)
