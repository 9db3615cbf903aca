"""One decoder module for the Llama, Mistral, Qwen2, Qwen3 and Gemma families, paged KV.

Differences between the families are flags of ModelConfig: qkv bias (Qwen2), per-head q/k
RMSNorm before RoPE (Qwen3, Gemma 3), tied embeddings, llama3 RoPE scaling, per layer sliding
windows (Mistral, Qwen2, Gemma), Gemma 2's soft-capped attention scores, GPT-OSS's attention
sinks; the Gemmas' layer is gpu/gemma3_layer.py. Projections are fused (qkv, gate+up) so a
layer runs four GEMMs; gpu/weight_fill.py fills them from HF tensor names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.layer_classes import layer_class
from troupe.gpu.layer_norm import layer_norm
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.quant_linear import Projection, Weight, embedding, linear
from troupe.gpu.query_scale import install_query_factors, position_scaled
from troupe.gpu.rope_layers import identity_table, layer_tables, rope_table
from troupe.kernels.ops import KernelBackend, KernelOps, select_ops
from troupe.kernels.streaming_attention import rotate_queries, streaming_attention

if TYPE_CHECKING:
    from troupe.gpu.lora_runtime import LoraRuntime
    from troupe.gpu.target_hidden import TargetHidden
    from troupe.gpu.vision_encoder import VisionEncoder

KVCache = tuple[torch.Tensor, torch.Tensor]


def new_param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    """A weight of the given shape, uninitialized (the loader fills it) and frozen."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP; the residual stream is carried by the fused norm."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__()
        c = config
        self.config = c
        self.sliding_window = c.window_of(layer_index)  # 0: full attention

        def param(*shape: int) -> nn.Parameter:
            return new_param(*shape, dtype=dtype, device=device)

        self.input_layernorm = param(c.hidden_size)
        # projections: dense, or quantized as shipped (gpu/quant_install.py replaces them)
        self.qkv_proj: Projection = param(c.q_size + 2 * c.kv_size, c.hidden_size)
        self.qkv_bias = param(c.q_size + 2 * c.kv_size) if c.qkv_bias else None
        self.q_norm = param(c.head_dim) if c.qk_norm else None
        self.k_norm = param(c.head_dim) if c.qk_norm else None
        self.o_proj: Projection = param(c.hidden_size, c.q_size)
        self.o_bias = param(c.hidden_size) if c.o_bias else None
        self.post_attention_layernorm = param(c.hidden_size)
        self.gate_up_proj: Projection = param(2 * c.intermediate_size, c.hidden_size)
        self.down_proj: Projection = param(c.hidden_size, c.intermediate_size)
        self.gate_up_bias = param(2 * c.intermediate_size) if c.mlp_bias else None
        self.down_bias = param(c.hidden_size) if c.mlp_bias else None
        self.scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
        self.softcap = c.attn_logit_softcapping or 0.0  # Gemma 2: scores capped (0: not)
        self.sinks = param(c.num_heads) if c.attention_sinks else None  # GPT-OSS
        self.query_factors: torch.Tensor | None = None  # Ministral 3's (gpu/query_scale.py)
        self.gelu = c.hidden_act == "gelu_tanh"  # the MLP's gate: GeGLU, else SwiGLU
        # Granite: its attention scale, and the outputs' weight in the residual stream
        self.residual_scale: float | None = None
        if c.granite is not None:
            self.scale, self.residual_scale = c.granite.attention, c.granite.residual
        # fp8 KV: this layer's per-KV-head scales [Hkv] (views of the pool's; set_kv_scales)
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None

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
        c, scale = self.config, self.residual_scale
        x, residual = ops.rms_norm(hidden, self.input_layernorm, c.rms_norm_eps, residual)
        hidden = self.attention(x, positions, meta, kv_cache, cos_sin, ops)
        if scale is not None:
            hidden = hidden * scale
        x, residual = ops.rms_norm(hidden, self.post_attention_layernorm, c.rms_norm_eps, residual)
        out = self.mlp(x, ops)
        return (out if scale is None else out * scale), residual

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        """The feed-forward block (SwiGLU, the Gemmas' GeGLU); an MoE layer routes to its
        experts instead; the tensor-parallel layer all-reduces its output (gpu/tp_model.py)."""
        gate_up = linear(x, self.gate_up_proj, self.gate_up_bias)
        gated = ops.gelu_tanh_mul(gate_up) if self.gelu else ops.silu_mul(gate_up)
        return linear(gated, self.down_proj, self.down_bias)

    def project_qkv(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        """The q | k | v rows of x (a seam: OLMo 2 normalises q and k whole here)."""
        return linear(x, self.qkv_proj, self.qkv_bias)

    def attention(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        cos_sin: torch.Tensor,
        ops: KernelOps,
    ) -> torch.Tensor:
        """o_proj(attention(x)): the KV of x written to the cache, then paged attention."""
        c = self.config
        eps = c.rms_norm_eps
        qkv = self.project_qkv(x, ops)
        num_tokens = qkv.shape[0]
        k_cache, v_cache = kv_cache
        k_scale, v_scale = self.k_scale, self.v_scale
        if k_scale is not None and v_scale is not None:  # fp8: unset scales from this batch
            ops.update_kv_scales(
                qkv, self.k_norm, eps, c.num_kv_heads, c.head_dim, k_scale, v_scale
            )
        stream, q_sink = meta.streaming, None
        if stream is not None and not meta.is_decode:  # StreamingLLM chunks: cache positions
            q_sink = rotate_queries(
                qkv, self.q_norm, eps, stream.cache_positions, cos_sin, c.num_heads, c.head_dim
            )
        # A prefill's new keys read from qkv's rows, not the cache (kernels/extend_attention.py):
        # prepare_qkv leaves there what the cache got. Not StreamingLLM's cache positions.
        extend = ops.reads_new_kv and not meta.is_decode and stream is None
        # q/k norm (Qwen3), rotary and the KV write in one pass; None weights skip the norm
        q = ops.prepare_qkv(
            qkv,
            self.q_norm,
            self.k_norm,
            eps,
            positions,
            cos_sin,
            k_cache,
            v_cache,
            meta.slot_mapping,
            k_scale=k_scale,
            v_scale=v_scale,
            keep_k=extend,
        )
        q = self.scale_queries(q, positions)
        new_kv = None
        if extend:
            kv = qkv[:, c.q_size :].view(num_tokens, 2, c.num_kv_heads, c.head_dim)
            new_kv = (kv[:, 0], kv[:, 1])
        if stream is not None:
            attn = streaming_attention(
                q, q_sink, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                meta.query_start_loc, stream, self.scale, cos_sin, k_scale=k_scale,
                v_scale=v_scale,
            )  # fmt: skip
        elif meta.is_decode:
            attn = ops.paged_decode_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                self.scale,
                meta.max_seq_len,
                sliding_window=self.sliding_window,
                k_scale=k_scale,
                v_scale=v_scale,
                seq_order=meta.decode_order,
                softcap=self.softcap,
                sinks=self.sinks,
            )
        else:
            attn = ops.paged_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                meta.query_start_loc,
                self.scale,
                meta.max_query_len,
                meta.max_seq_len,
                meta.decode_prefix,
                sliding_window=self.sliding_window,
                k_scale=k_scale,
                v_scale=v_scale,
                seq_order=meta.decode_order,
                new_kv=new_kv,
                softcap=self.softcap,
                sinks=self.sinks,
                key_limits=meta.key_limits,
            )
        return linear(attn.reshape(num_tokens, c.q_size), self.o_proj, self.o_bias)

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rotated queries [T, Hq, D] as attention reads them (Ministral 3's scaled)."""
        factors = self.query_factors
        return q if factors is None else position_scaled(q, positions, factors)

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """A subclass's own weights (gpu/moe_layer.py): (destination, fill keys) of a
        layer-relative HF name, None when not one of them."""
        return None

    def fill_parts(self) -> dict[str, tuple[str, ...]]:
        """A subclass's parameters filled piece by piece: name -> the pieces' fill keys."""
        return {}


def set_layer_kv_scales(layers: nn.ModuleList, scales: torch.Tensor | None) -> None:
    """fp8 KV: layer i's writes and reads use scales[i] ([k | v, kv head]); None: none."""
    for i, layer in enumerate(layers):
        assert isinstance(layer, DecoderLayer)
        layer.k_scale = None if scales is None else scales[i, 0]
        layer.v_scale = None if scales is None else scales[i, 1]


class DecoderModel(nn.Module):
    """Embeddings, decoder layers, final norm and lm_head, for a flat batch of tokens."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int,
        kernel_backend: KernelBackend = "auto",
    ) -> None:
        super().__init__()
        c = config
        self.config = c
        self.dtype = dtype
        self.device = device
        self.ops = select_ops(device, kernel_backend)
        self.embed_tokens: Weight = new_param(
            c.vocab_size, c.hidden_size, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            self.make_layer(c, dtype, device, i) for i in range(c.num_layers)
        )
        install_query_factors(self.layers, c, max_positions, device)
        self.norm = new_param(c.hidden_size, dtype=dtype, device=device)
        # the final LayerNorm's bias (StarCoder2's; final_norm)
        self.norm_bias = (
            new_param(c.hidden_size, dtype=dtype, device=device) if c.norm_bias else None
        )
        self.lora: LoraRuntime | None = None  # LoRA adapters (gpu/lora_runtime.install_lora)
        # a multimodal checkpoint's image encoder, when its images are served (gpu/vision_load)
        self.vision: VisionEncoder | None = None
        # what an EAGLE head reads of every row (gpu/target_hidden.py)
        self.target_hidden: TargetHidden | None = None
        self.lm_head: Weight | None = (
            None
            if c.tie_word_embeddings
            else new_param(c.vocab_size, c.hidden_size, dtype=dtype, device=device)
        )
        # a classifier's score head [num_labels, hidden] (gpu/classifier_config.py)
        self.score: nn.Parameter | None = (
            None
            if c.classifier is None
            else new_param(c.classifier.num_labels, c.hidden_size, dtype=dtype, device=device)
        )
        self.score_bias: nn.Parameter | None = (  # a token classifier's [num_labels]
            None
            if c.classifier is None or not c.classifier.has_bias
            else new_param(c.classifier.num_labels, dtype=dtype, device=device)
        )

        # fp32 tables: rotary reads them per token and casts, so angles keep full precision.
        # Gemma 3's and OLMo 3's windowed layers rotate unscaled (on their own base), SmolLM3's
        # NoPE layers not at all; a partial rotary's table is widened (gpu/rope_layers.py)
        def table(theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
            return rope_table(c.head_dim, c.rope_dim, max_positions, theta, scaling, device)

        self.register_buffer("cos_sin_cache", table(c.rope_theta, c.rope_scaling), persistent=False)
        theta = c.rope_local_theta
        local = None if theta is None else table(theta, None)
        self.register_buffer("cos_sin_local", local, persistent=False)
        none = identity_table(c.head_dim, max_positions, device) if c.nope_layers else None
        self.register_buffer("cos_sin_none", none, persistent=False)
        self._rope_tables = layer_tables(
            c.layer_windows, c.nope_layers, local is not None, c.num_layers
        )

    def make_layer(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, index: int
    ) -> DecoderLayer:
        """Layer `index` (a seam: the tensor-parallel model, gpu/tp_model.py, builds its own)."""
        return layer_class(config, index)(config, dtype, device, index)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of the tokens (the tensor-parallel model gathers its vocab shards)."""
        return embedding(input_ids, self.embed_tokens, self.dtype)

    def input_hidden(
        self,
        input_ids: torch.Tensor,
        input_rows: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> torch.Tensor:
        """The first layer's input: the tokens' embedding rows (Gemma 3, Granite: scaled), with
        an embeddings prompt's rows put in by `input_rows` (gpu/embed_rows.py)."""
        hidden = self.embed(input_ids)
        if self.config.is_gemma:  # HF scales in the weights' dtype
            hidden = hidden * torch.tensor(self.config.hidden_size**0.5, dtype=hidden.dtype)
        if input_rows is not None:  # after Gemma's scaling: HF's inputs_embeds are not scaled
            hidden = input_rows(hidden)
        granite = self.config.granite
        if granite is not None:  # Granite's inputs_embeds are scaled too
            hidden = hidden * granite.embedding
        return hidden

    def set_kv_scales(self, scales: torch.Tensor | None) -> None:
        """fp8 KV: scales [layer, k | v, kv head] that each layer's writes set and reads use."""
        set_layer_kv_scales(self.layers, scales)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        input_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Hidden states [N, hidden] of only the rows in meta.logits_indices, after the norm.
        `input_rows`: puts an embeddings prompt's rows in place of theirs (gpu/embed_rows.py)."""
        hidden = self.input_hidden(input_ids, input_rows)
        if self.lora is not None:  # each token's adapter slot, for every projection
            self.lora.begin(len(input_ids))
        residual: torch.Tensor | None = None
        taps = self.target_hidden
        for i, (layer, kv_cache, table) in enumerate(
            zip(self.layers, kv_caches, self._rope_tables, strict=True)
        ):
            if taps is not None:  # EAGLE-3: the residual stream entering tapped layers
                taps.put_layer(i, hidden, residual)
            cos_sin = self.get_buffer(table)
            hidden, residual = layer(hidden, residual, positions, meta, kv_cache, cos_sin, self.ops)
        assert residual is not None
        idx, eps = meta.logits_indices, self.config.rms_norm_eps
        if taps is not None:
            taps.put_layer(len(self.layers), hidden, residual)
            if taps.needs_final:  # EAGLE-1 reads every row: normalize all, then pick
                normed: torch.Tensor = self.final_norm(hidden, self.norm, eps, residual)[0]
                taps.put_final(normed)
                return normed[idx]
        if idx.numel() == 0:  # only mid-prompt chunks: no kernel launch on an empty grid
            return hidden[:0]
        out: torch.Tensor = self.final_norm(hidden[idx], self.norm, eps, residual[idx])[0]
        return out

    def final_norm(
        self, hidden: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The final norm of the last layer's (hidden, residual), fused with their add, as
        KernelOps.rms_norm returns it: RMSNorm, or a LayerNorm (Cohere's; StarCoder2's with
        `norm_bias`)."""
        if self.config.layer_norm:
            return layer_norm(hidden, weight, eps, residual, self.norm_bias)
        out: tuple[torch.Tensor, torch.Tensor] = self.ops.rms_norm(hidden, weight, eps, residual)
        return out

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] for the selected hidden states, in `logits_dtype`. Not upcast here:
        the sampler's draw reads bf16 as it is (an fp32 copy of 256 x 151,936 logits cost
        0.11 ms of an H200 decode step) and upcasts only what arithmetic needs."""
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        return self.config.final_logits(linear(hidden, weight))

    @property
    def logits_dtype(self) -> torch.dtype:
        """compute_logits' dtype: the model's, fp32 where the model soft-caps its logits."""
        return self.dtype if self.config.final_logit_softcapping is None else torch.float32
