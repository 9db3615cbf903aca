"""A plain torch StreamingLLM decoder: the reference the engine's streaming mode is checked
against (tests, ops/streaming_bench.py).

It is the paper's own arithmetic (Xiao et al. 2023, "pos-shift"), one token at a time: keys are
kept before rotary, the cache is [first S tokens | last W tokens, the new one included], and at
every step its keys are rotated at their positions within the cache (0 .. n-1) and the query at
n-1, then plain softmax attention. Nothing of the engine's paged path is shared: no block
tables, no absolute positions, no second query. It reuses only the model's weights, read through
`quant_linear.linear` so quantized weights give the same products.

Memory stays bounded like the engine's: tokens that left the window are dropped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.models import DecoderLayer, DecoderModel
from troupe.gpu.quant_linear import embedding, linear


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, H, D] rotated with cos/sin [n, 1, D] (rotate_half layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class StreamingReference:
    """Feed tokens one by one (`step`); each returns the fp32 logits after that token."""

    def __init__(self, model: DecoderModel, *, sink_tokens: int, window: int) -> None:
        c = model.config
        if c.mla is not None or c.layer_windows or c.is_gemma or c.moe is not None:
            raise ValueError("the streaming reference covers dense models without windows")
        self.model, self.sink_tokens, self.window = model, sink_tokens, window
        self.num_tokens = 0
        # per layer: kept positions' un-rotated keys and values, [Hkv, D] each, in order
        self.keys: list[list[torch.Tensor]] = [[] for _ in range(c.num_layers)]
        self.values: list[list[torch.Tensor]] = [[] for _ in range(c.num_layers)]
        self.positions: list[int] = []  # the absolute positions kept, in order
        cos, sin = model.get_buffer("cos_sin_cache").float().chunk(2, dim=-1)
        self._cos: torch.Tensor = cos
        self._sin: torch.Tensor = sin

    @torch.inference_mode()
    def step(self, token_id: int) -> torch.Tensor:
        model, c = self.model, self.model.config
        p = self.num_tokens
        self.num_tokens += 1
        self.positions.append(p)
        # evict: keep the sinks and the last `window` positions (this one included)
        keep = [
            i for i, q in enumerate(self.positions) if q < self.sink_tokens or q > p - self.window
        ]
        self.positions = [self.positions[i] for i in keep]
        n = len(self.positions)
        cos = torch.cat((self._cos[:n], self._cos[:n]), dim=-1)[:, None]  # cache positions
        sin = torch.cat((self._sin[:n], self._sin[:n]), dim=-1)[:, None]
        x = embedding(torch.tensor([token_id]), model.embed_tokens, torch.float32).float()
        for i, layer in enumerate(model.layers):
            assert isinstance(layer, DecoderLayer)
            h = _norm(x, layer.input_layernorm.float(), c.rms_norm_eps)
            qkv = linear(h, layer.qkv_proj, layer.qkv_bias).float()[0]
            q = qkv[: c.q_size].view(c.num_heads, c.head_dim)
            k = qkv[c.q_size : c.q_size + c.kv_size].view(c.num_kv_heads, c.head_dim)
            v = qkv[c.q_size + c.kv_size :].view(c.num_kv_heads, c.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = _norm(q, layer.q_norm.float(), c.rms_norm_eps)
                k = _norm(k, layer.k_norm.float(), c.rms_norm_eps)
            keys, values = self.keys[i], self.values[i]
            keys.append(k)
            values.append(v)
            self.keys[i] = keys = [keys[j] for j in keep]
            self.values[i] = values = [values[j] for j in keep]
            k_all = _rope(torch.stack(keys), cos, sin)  # [n, Hkv, D] at 0 .. n-1
            q_rot = _rope(q[None], cos[-1:], sin[-1:])  # at n-1
            # query head h reads KV head h // group (grouped-query attention)
            q_grouped = q_rot[0].view(c.num_kv_heads, -1, c.head_dim)
            scores = torch.einsum("kgd,nkd->kgn", q_grouped, k_all) * layer.scale
            attn = torch.einsum("kgn,nkd->kgd", scores.softmax(-1), torch.stack(values))
            x = x + linear(attn.reshape(1, c.q_size), layer.o_proj, layer.o_bias).float()
            h = _norm(x, layer.post_attention_layernorm.float(), c.rms_norm_eps)
            gate_up = linear(h, layer.gate_up_proj, layer.gate_up_bias).float()
            gate, up = gate_up.chunk(2, dim=-1)
            x = x + linear(F.silu(gate) * up, layer.down_proj, layer.down_bias).float()
        x = _norm(x, model.norm.float(), c.rms_norm_eps)
        head = model.embed_tokens if model.lm_head is None else model.lm_head
        return linear(x, head).float()[0]
