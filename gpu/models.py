"""One decoder module for the Llama, Mistral, Qwen2, Qwen3 and Gemma 3 families, paged KV.

Differences between the families are flags of ModelConfig: qkv bias (Qwen2), per-head q/k
RMSNorm before RoPE (Qwen3, Gemma 3), tied embeddings, llama3 RoPE scaling, per layer sliding
windows (Mistral, Qwen2, Gemma 3); Gemma 3's layer is gpu/gemma3_layer.py. Projections are fused
(qkv, gate+up) so a layer runs four GEMMs; `load_weights` takes HF tensor names.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.quant_linear import Weight, embedding, linear
from troupe.kernels.kv_quant import update_kv_scales
from troupe.kernels.ops import KernelBackend, KernelOps, select_ops
from troupe.kernels.rope_cache import build_cos_sin_cache

KVCache = tuple[torch.Tensor, torch.Tensor]


def _param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


def _dense(weight: Weight | None) -> torch.Tensor | None:
    """The parameter to copy a dense tensor into; None (skip) where a quantized weight sits."""
    return weight if isinstance(weight, torch.Tensor) else None


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
            return _param(*shape, dtype=dtype, device=device)

        self.input_layernorm = param(c.hidden_size)
        # projections: dense, or quantized as shipped (gpu/quant_install.py replaces them)
        self.qkv_proj: Weight = param(c.q_size + 2 * c.kv_size, c.hidden_size)
        self.qkv_bias = param(c.q_size + 2 * c.kv_size) if c.qkv_bias else None
        self.q_norm = param(c.head_dim) if c.qk_norm else None
        self.k_norm = param(c.head_dim) if c.qk_norm else None
        self.o_proj: Weight = param(c.hidden_size, c.q_size)
        self.post_attention_layernorm = param(c.hidden_size)
        self.gate_up_proj: Weight = param(2 * c.intermediate_size, c.hidden_size)
        self.down_proj: Weight = param(c.hidden_size, c.intermediate_size)
        self.scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
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
        c = self.config
        x, residual = ops.rms_norm(hidden, self.input_layernorm, c.rms_norm_eps, residual)
        hidden = self.attention(x, positions, meta, kv_cache, cos_sin, ops)
        x, residual = ops.rms_norm(hidden, self.post_attention_layernorm, c.rms_norm_eps, residual)
        return self.mlp(x, ops), residual

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        """The feed-forward block (SwiGLU); an MoE layer routes to its experts instead."""
        return linear(ops.silu_mul(linear(x, self.gate_up_proj)), self.down_proj)

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
        qkv = linear(x, self.qkv_proj, self.qkv_bias)
        num_tokens = qkv.shape[0]
        k_cache, v_cache = kv_cache
        k_scale, v_scale = self.k_scale, self.v_scale
        if k_scale is not None and v_scale is not None:  # fp8: unset scales from this batch
            update_kv_scales(qkv, self.k_norm, eps, c.num_kv_heads, c.head_dim, k_scale, v_scale)
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
        )
        if meta.is_decode:
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
            )
        return linear(attn.reshape(num_tokens, c.q_size), self.o_proj)

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """A subclass's own weights (gpu/moe_layer.py): (destination, fill keys) of a
        layer-relative HF name, None when not one of them."""
        return None

    def fill_parts(self) -> dict[str, tuple[str, ...]]:
        """A subclass's parameters filled piece by piece: name -> the pieces' fill keys."""
        return {}


def _layer_class(config: ModelConfig, layer: int) -> type[DecoderLayer]:
    """The module of one layer: Gemma 3's, an MoE layer (gpu/moe_layer.py) or the plain one."""
    if config.is_gemma3:
        from troupe.gpu.gemma3_layer import Gemma3Layer  # they subclass DecoderLayer

        return Gemma3Layer
    if config.is_sparse(layer):
        from troupe.gpu.moe_layer import MoeLayer

        return MoeLayer
    return DecoderLayer


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
        self.embed_tokens: Weight = _param(c.vocab_size, c.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            self.make_layer(c, dtype, device, i) for i in range(c.num_layers)
        )
        self.norm = _param(c.hidden_size, dtype=dtype, device=device)
        self.lm_head: Weight | None = (
            None
            if c.tie_word_embeddings
            else _param(c.vocab_size, c.hidden_size, dtype=dtype, device=device)
        )
        # fp32 table: rotary reads it per token and casts, so angles keep full precision
        self.register_buffer(
            "cos_sin_cache",
            build_cos_sin_cache(
                c.head_dim, max_positions, c.rope_theta, c.rope_scaling, torch.float32, device
            ),
            persistent=False,
        )
        # Gemma 3's windowed layers rotate on their own base, without scaling
        self.register_buffer(
            "cos_sin_local",
            None
            if c.rope_local_theta is None
            else build_cos_sin_cache(
                c.head_dim, max_positions, c.rope_local_theta, None, torch.float32, device
            ),
            persistent=False,
        )

        self._rope_tables = [
            "cos_sin_local"
            if c.window_of(i) and c.rope_local_theta is not None
            else "cos_sin_cache"
            for i in range(c.num_layers)
        ]

    def make_layer(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, index: int
    ) -> DecoderLayer:
        """Layer `index` (a seam: the tensor-parallel model, gpu/tp_model.py, builds its own)."""
        return _layer_class(config, index)(config, dtype, device, index)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of the tokens (the tensor-parallel model gathers its vocab shards)."""
        return embedding(input_ids, self.embed_tokens, self.dtype)

    def set_kv_scales(self, scales: torch.Tensor | None) -> None:
        """fp8 KV: scales [layer, k | v, kv head] that each layer's writes set and reads use."""
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            layer.k_scale = None if scales is None else scales[i, 0]
            layer.v_scale = None if scales is None else scales[i, 1]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """Hidden states [N, hidden] of only the rows in meta.logits_indices, after the norm."""
        hidden = self.embed(input_ids)
        if self.config.is_gemma3:  # HF scales in the weights' dtype
            hidden = hidden * torch.tensor(self.config.hidden_size**0.5, dtype=hidden.dtype)
        residual: torch.Tensor | None = None
        for layer, kv_cache, table in zip(self.layers, kv_caches, self._rope_tables, strict=True):
            cos_sin = self.get_buffer(table)
            hidden, residual = layer(hidden, residual, positions, meta, kv_cache, cos_sin, self.ops)
        assert residual is not None
        idx = meta.logits_indices
        if idx.numel() == 0:  # only mid-prompt chunks: no kernel launch on an empty grid
            return hidden[:0]
        out: torch.Tensor = self.ops.rms_norm(
            hidden[idx], self.norm, self.config.rms_norm_eps, residual[idx]
        )[0]
        return out

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [N, vocab] for the selected hidden states."""
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = linear(hidden, weight).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @torch.inference_mode()
    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]], source: str) -> None:
        """Copy HF-named tensors into the fused parameters; every parameter must be filled."""
        c = self.config
        filled: set[str] = set()
        q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
        fused = {
            "self_attn.q_proj": ("qkv_proj", 0, q),
            "self_attn.k_proj": ("qkv_proj", q, kv),
            "self_attn.v_proj": ("qkv_proj", q + kv, kv),
            "mlp.gate_proj": ("gate_up_proj", 0, inter),
            "mlp.up_proj": ("gate_up_proj", inter, inter),
        }
        plain = {
            "input_layernorm.weight": "input_layernorm",
            "pre_feedforward_layernorm.weight": "pre_feedforward_layernorm",
            "post_feedforward_layernorm.weight": "post_feedforward_layernorm",
            "self_attn.o_proj.weight": "o_proj",
            "post_attention_layernorm.weight": "post_attention_layernorm",
            "mlp.down_proj.weight": "down_proj",
            "self_attn.q_norm.weight": "q_norm",
            "self_attn.k_norm.weight": "k_norm",
        }
        for name, tensor in tensors:
            target, start, size, key = self._locate(name, fused, plain)
            keys: tuple[str, ...] = (key,)
            extra = self._locate_extra(name) if target is None else None
            if extra is not None:
                target, start, keys = extra[0], None, extra[1]
            if target is None:
                continue  # e.g. rotary_emb.inv_freq in old checkpoints
            dest = target if start is None else target[start : start + size]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ModelLoadError(
                    f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(dest.shape)} from the config"
                )
            dest.copy_(tensor)
            filled.update(keys)
        missing = sorted(k for k in self._required_keys() if k not in filled)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ModelLoadError(f"{source}: missing weights for {', '.join(missing[:5])}{more}")
        if c.is_gemma3:  # Gemma's RMSNorm scales by (1 + weight): fold the 1 in once
            for name, param in self.named_parameters():
                if name.endswith("norm") or name.endswith("layernorm"):
                    param.add_(1.0)

    def _required_keys(self) -> list[str]:
        """Fill keys load_weights must see: one per plain parameter, one per fused slice."""
        slices = {
            "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "qkv_bias": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
        }
        keys = []
        for name, _ in self.named_parameters():
            last = name.rsplit(".", 1)[-1]
            keys += [f"{name}#{part}" for part in slices[last]] if last in slices else [name]
        for index, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            for param, parts in layer.fill_parts().items():
                whole = f"layers.{index}.{param}"
                keys = [k for k in keys if k != whole] + [f"{whole}#{part}" for part in parts]
        return keys

    def _locate_extra(self, name: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """A layer subclass's weight (MoE experts and router): (destination, fill keys)."""
        parts = name.split(".")
        if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
            return None
        layer = self.layers[int(parts[2])]
        assert isinstance(layer, DecoderLayer)
        return layer.locate_extra(".".join(parts[3:]), f"layers.{parts[2]}")

    def _locate(
        self, name: str, fused: dict[str, tuple[str, int, int]], plain: dict[str, str]
    ) -> tuple[torch.Tensor | None, int | None, int, str]:
        """HF name -> (destination tensor, slice start or None, slice size, fill key)."""
        if name == "model.embed_tokens.weight":
            return _dense(self.embed_tokens), None, 0, "embed_tokens"
        if name == "model.norm.weight":
            return self.norm, None, 0, "norm"
        if name == "lm_head.weight":
            return _dense(self.lm_head), None, 0, "lm_head"  # None when tied: ignored
        parts = name.split(".")
        if len(parts) < 5 or parts[:2] != ["model", "layers"]:
            return None, None, 0, ""
        index = int(parts[2])
        layer = self.layers[index]
        assert isinstance(layer, DecoderLayer)
        rest = ".".join(parts[3:])
        prefix = f"layers.{index}"
        if rest in plain:
            found: torch.Tensor | None = getattr(layer, plain[rest])
            return found, None, 0, f"{prefix}.{plain[rest]}"
        module, kind = rest.rsplit(".", 1)
        if module in fused:
            param, start, size = fused[module]
            if kind == "bias":
                if layer.qkv_bias is None:
                    return None, None, 0, ""
                return layer.qkv_bias, start, size, f"{prefix}.qkv_bias#{module}"
            dest: torch.Tensor = getattr(layer, param)
            return dest, start, size, f"{prefix}.{param}#{module}"
        return None, None, 0, ""
