"""DeepSeek-V2/V3's decoder layer: multi-head latent attention (MLA) and a dense or MoE MLP.

    q        q_proj(x), or q_b_proj(rms(q_a_proj(x))) with q_lora_rank   -> [T, H, Dn | R]
    latent   kv_a_proj_with_mqa(x) = [c' | k_r'];  c = rms(c') (L), k_r = rope(k_r') (R)
    cache    [c | k_r] per token, one row for all heads (gpu/kv_cache.py, L + R values)
    attend   ops.mla_attention: kv_b_proj absorbed into the query (decode rows; every row
             on CUDA unless the step expands, kernels/mla_ops.py; the CPU reference expands
             prefill rows); a step with meta.expanded_prefill splits: its leading decodes
             absorbed, its prefill sequences through ops.mla_prefill, kv_b_proj expanding c
             to per-head K/V for the paged prefill kernel (kernels/mla_prefill.py)
    out      o_proj(attention [T, H * Dv])

RoPE touches only the R rope dims. DeepSeek rotates interleaved pairs (x0, x1), (x2, x3) ...
(transformers' V2 complex product and V3's rope_interleave); the rotated vector is kept in
halves layout [evens | odds] for q and k alike, which leaves every q . k unchanged. Without
rope_interleave (V3 only) the halves are rotated as they stand (rotate_half).

The MLP is DecoderLayer's SwiGLU on dense layers (the first first_k_dense_replace) and
gpu/deepseek_moe.py on the others. The KV pool gives this layer (cache, cache): one plane.
"""

from __future__ import annotations

import torch
from torch import nn
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.deepseek_moe import DeepseekMoe
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, KVCache, new_param
from troupe.gpu.quant_linear import linear
from troupe.kernels.ops import KernelOps

# HF name under self_attn. -> this layer's parameter
_ATTENTION = {
    "q_proj.weight": "q_proj",
    "q_a_proj.weight": "q_a_proj",
    "q_a_layernorm.weight": "q_a_layernorm",
    "q_b_proj.weight": "q_b_proj",
    "kv_a_proj_with_mqa.weight": "kv_a_proj",
    "kv_a_layernorm.weight": "kv_a_layernorm",
    "kv_b_proj.weight": "kv_b_proj",
}


def rotate_rope(
    x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """x [T, heads, R] rotated at positions [T]; the result in halves layout (see above)."""
    half = x.shape[-1] // 2
    table = cos_sin.index_select(0, positions.long())[:, None, :].float()
    cos, sin = table[..., :half], table[..., half:]
    xf = x.float()  # in fp32 as transformers' V2 (complex product) does
    x1, x2 = (xf[..., 0::2], xf[..., 1::2]) if interleaved else (xf[..., :half], xf[..., half:])
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class MlaLayer(DecoderLayer):
    """DecoderLayer with MLA attention, and DeepseekMoe as the MLP on sparse layers."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        mla = config.mla
        assert mla is not None
        self.mla = mla
        del self.qkv_proj  # MLA projects q and the latent separately
        h, heads = config.hidden_size, mla.num_heads
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim

        def param(*shape: int) -> nn.Parameter:
            return new_param(*shape, dtype=dtype, device=device)

        if mla.q_lora_rank:
            self.q_a_proj = param(mla.q_lora_rank, h)
            self.q_a_layernorm = param(mla.q_lora_rank)
            self.q_b_proj = param(heads * qk, mla.q_lora_rank)
        else:
            self.q_proj = param(heads * qk, h)
        self.kv_a_proj = param(mla.latent_size, h)
        self.kv_a_layernorm = param(mla.kv_lora_rank)
        self.kv_b_proj = param(heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank)
        self.o_proj = param(h, heads * mla.v_head_dim)
        self.scale = mla.softmax_scale
        self.experts: DeepseekMoe | None = None
        if config.is_sparse(layer_index):
            del self.gate_up_proj, self.down_proj
            self.experts = self.make_experts(config, dtype, device)

    def make_experts(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device
    ) -> DeepseekMoe:
        """The sparse layer's experts (the seam a tensor-parallel rank's layer overrides)."""
        return DeepseekMoe(config, dtype, device)

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        """SwiGLU on dense layers, the routed and shared experts on sparse ones."""
        return super().mlp(x, ops) if self.experts is None else self.experts(x, ops)

    def attention(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        cos_sin: torch.Tensor,
        ops: KernelOps,
    ) -> torch.Tensor:
        """o_proj(MLA(x)): the tokens' latents written to the cache, then latent attention."""
        m, eps = self.mla, self.config.rms_norm_eps
        num_tokens = x.shape[0]
        if m.q_lora_rank:
            q_a = ops.rms_norm(linear(x, self.q_a_proj), self.q_a_layernorm, eps)[0]
            q = linear(q_a, self.q_b_proj)
        else:
            q = linear(x, self.q_proj)
        q = q.view(num_tokens, m.num_heads, m.qk_nope_head_dim + m.qk_rope_head_dim)
        q_nope, q_pe = q[..., : m.qk_nope_head_dim], q[..., m.qk_nope_head_dim :]
        compressed = linear(x, self.kv_a_proj)
        latent = compressed[:, : m.kv_lora_rank].contiguous()
        latent = ops.rms_norm(latent, self.kv_a_layernorm, eps)[0]
        k_pe = compressed[:, None, m.kv_lora_rank :]
        q_pe = rotate_rope(q_pe, positions, cos_sin, m.rope_interleave).contiguous()
        k_pe = rotate_rope(k_pe, positions, cos_sin, m.rope_interleave)[:, 0].contiguous()
        cache = kv_cache[0].flatten(2)  # [blocks, block_size, L + R]
        ops.write_latent(latent, k_pe, cache, meta.slot_mapping)
        if meta.expanded_prefill is None:
            attn = ops.mla_attention(
                q_nope,
                q_pe,
                cache,
                self.kv_b_proj,
                meta.block_tables,
                meta.seq_lens,
                meta.query_start_loc,
                m.v_head_dim,
                self.scale,
                meta.is_decode,
            )
        else:
            attn = self._split_attention(q_nope, q_pe, cache, meta, ops)
        return linear(attn.reshape(num_tokens, m.num_heads * m.v_head_dim), self.o_proj)

    def _split_attention(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        cache: torch.Tensor,
        meta: AttentionMetadata,
        ops: KernelOps,
    ) -> torch.Tensor:
        """The leading one-token decodes absorbed, the prefill sequences expanded (rows
        first..T: decode s owns row s, so the prefill rows start at row `first`)."""
        split = meta.expanded_prefill
        assert split is not None
        m, first = self.mla, split.first_prefill
        out = q_nope.new_empty(q_nope.shape[0], m.num_heads, m.v_head_dim)
        if first:
            out[:first] = ops.mla_attention(
                q_nope[:first],
                q_pe[:first],
                cache,
                self.kv_b_proj,
                meta.block_tables[:first],
                meta.seq_lens[:first],
                meta.query_start_loc[: first + 1],
                m.v_head_dim,
                self.scale,
                True,
            )
        out[first:] = ops.mla_prefill(
            q_nope[first:],
            q_pe[first:],
            cache,
            self.kv_b_proj,
            split.blocks,
            split.tables,
            meta.seq_lens[first:],
            meta.query_start_loc[first:] - first,
            m.v_head_dim,
            self.scale,
            meta.max_query_len,
            split.max_seq_len,
        )
        return out

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """MLA projections (self_attn.*) and the experts (mlp.gate, mlp.experts, ...)."""
        if rest.startswith("self_attn.") and rest.removeprefix("self_attn.") in _ATTENTION:
            name = _ATTENTION[rest.removeprefix("self_attn.")]
            if name not in self._parameters:
                return None
            return self._parameters[name], (f"{prefix}.{name}",)  # type: ignore[return-value]
        if self.experts is not None:
            return self.experts.locate(rest, f"{prefix}.experts")
        return None

    def fill_parts(self) -> dict[str, tuple[str, ...]]:
        parts = {} if self.experts is None else self.experts.fill_parts()
        return {f"experts.{name}": pieces for name, pieces in parts.items()}
