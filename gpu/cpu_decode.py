"""One sequence's decode step on the CPU in few torch calls: the single-stream fast path.

A decode step of one sequence on the CPU is bound by call overhead: the generic forward
(gpu/models.py over kernels/reference.py) makes ~60 torch calls per layer of a few
microseconds each, beside the packed int4 matmuls. This path runs the same arithmetic with
what one row does not need left out:

- per step, once for all layers: the rotary row (cos, sin), the KV slot, the check that the
  sequence's blocks are consecutive (then K and V are strided views of the pool, else one
  index_select of its blocks);
- per layer: no module call, no dtype dispatch, no mask; the int4 matmuls take their input
  rows written straight by the op before them. With the native kernel (gpu/cpu_q4.py) those
  are fp32 in and out. With torch's int4 kernel they are bf16 (`torch.mul(..., out=bf16)`
  rounds the fp32 product once, as `.to(bfloat16)` after it did) and it hands back bf16 that
  the next fp32 op promotes exactly (bf16 -> fp32 is exact), so no cast call is left on either
  side of them.

The result is bit-identical to the generic path (tests/gpu/test_cpu_decode.py checks the
logits with torch.equal). It serves what the default model needs: plain decoder layers
(Llama, Qwen2, Mistral shapes: no q/k norm, no sliding window), fp32 weights in memory and
cache, every projection a packed CPU int4 weight of whole 16-row tiles, all of one form (native
or torch's); anything else returns None from `CpuDecode.build` and runs the generic forward.
With LoRA adapters loaded it is built on the base weights and runs only the steps without an
adapter (ForwardPass asks LoraRuntime.is_idle); the others take the generic forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from troupe.gpu.cpu_int4 import CpuInt4
from troupe.gpu.cpu_layers import NativeLayers
from troupe.gpu.cpu_q4 import CpuQ4
from troupe.gpu.cpu_thread_tuner import OneRowTuner
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.lora_linear import base_weight
from troupe.gpu.models import DecoderLayer, DecoderModel
from troupe.gpu.quant_linear import Int4Linear, Projection
from troupe.gpu.step_inputs import StepInputs

_int4_mm = torch.ops.aten._weight_int4pack_mm_for_cpu


@dataclass(frozen=True, slots=True)
class _Proj:
    """A packed int4 weight's kernel arguments."""

    packed: torch.Tensor
    group_size: int
    scale_zero: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """bf16 x [1, K] -> bf16 [1, N]."""
        out: torch.Tensor = _int4_mm(x, self.packed, self.group_size, self.scale_zero)
        return out


Proj = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Proj
    qkv_bias: torch.Tensor | None
    o: Proj
    gate_up: Proj
    down: Proj
    flat_k: torch.Tensor  # the layer's K pool as token rows [blocks * block_size, Hkv, D]
    flat_v: torch.Tensor
    scale: float


def _proj(weight: Projection) -> tuple[Proj, torch.dtype] | None:
    """The kernel call of a CPU int4 weight and the dtype it takes: the native kernel's rows
    (fp32), or torch's kernel where its packed rows are its own (no padding; bf16)."""
    if not isinstance(weight, Int4Linear):
        return None
    cpu = weight.cpu_int4
    if isinstance(cpu, CpuQ4):
        return cpu.rows, torch.float32
    if not isinstance(cpu, CpuInt4) or cpu.packed.shape[0] != cpu.num_rows:
        return None
    return _Proj(cpu.packed, cpu.group_size, cpu.scale_zero), torch.bfloat16


class CpuDecode:
    """Runs StepInputs of one decoding sequence to its fp32 logits [1, vocab]."""

    def __init__(
        self, model: DecoderModel, layers: list[_Layer], kv: KVCache, act_dtype: torch.dtype
    ) -> None:
        c = model.config
        self.model = model
        self.layers = layers
        self.eps = c.rms_norm_eps
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.intermediate = c.intermediate_size
        self.block_size = kv.block_size
        self.cos_sin: torch.Tensor = model.get_buffer("cos_sin_cache")
        self.act_dtype = act_dtype  # what the int4 matmuls take
        # every layer in one native call where all projections are native (gpu/cpu_layers.py)
        native = NativeLayers.build(model, kv) if act_dtype == torch.float32 else None
        self.native = native
        # cpu_kernel_threads 0: the decode step's thread count, timed (gpu/cpu_thread_tuner.py)
        choices = () if native is None else native.lib.one_row_choices
        self.tuner = None if native is None or not choices else OneRowTuner(native.lib, choices)
        self._act_hidden = torch.empty(1, c.hidden_size, dtype=act_dtype)
        self._act_inter = torch.empty(1, c.intermediate_size, dtype=act_dtype)

    @classmethod
    def build(cls, model: DecoderModel, kv: KVCache) -> CpuDecode | None:
        """The fast path for `model`, or None where it does not apply (module docstring)."""
        c = model.config
        if (
            model.device.type != "cpu"
            or model.dtype != torch.float32
            or c.qk_norm
            or c.is_gemma
            or c.mla is not None
            or c.rope_local_theta is not None
            or c.nope_layers
            or c.o_bias
            or c.mlp_bias
            or c.final_logit_softcapping is not None
            or c.granite is not None
            or c.query_scale is not None
        ):
            return None
        layers: list[_Layer] = []
        dtypes: set[torch.dtype] = set()
        for i, layer in enumerate(model.layers):
            if type(layer) is not DecoderLayer or layer.sliding_window or layer.k_scale is not None:
                return None
            k_cache, v_cache = kv.layers[i]
            if k_cache.dtype != torch.float32 or not k_cache.is_contiguous():
                return None
            # with LoRA adapters loaded: the base weights (it runs steps without adapters only)
            found = [_proj(base_weight(w)) for w in (layer.qkv_proj, layer.o_proj)]
            found += [_proj(base_weight(w)) for w in (layer.gate_up_proj, layer.down_proj)]
            projs = [p for p in found if p is not None]
            if len(projs) != len(found):
                return None
            dtypes.update(dtype for _, dtype in projs)
            qkv, o, gate_up, down = (call for call, _ in projs)
            layers.append(
                _Layer(
                    input_norm=layer.input_layernorm,
                    post_norm=layer.post_attention_layernorm,
                    qkv=qkv,
                    qkv_bias=layer.qkv_bias,
                    o=o,
                    gate_up=gate_up,
                    down=down,
                    flat_k=k_cache.view(-1, *k_cache.shape[2:]),
                    flat_v=v_cache.view(-1, *v_cache.shape[2:]),
                    scale=layer.scale,
                )
            )
        if len(dtypes) != 1:  # no layers, or native and torch kernels mixed
            return None
        return cls(model, layers, kv, dtypes.pop())

    def fits(self, inputs: StepInputs) -> bool:
        """A decode step of one sequence that samples, whose slot is real (no padding) and which
        attends to its whole table (a StreamingLLM sequence takes the generic path)."""
        return (
            inputs.is_decode
            and inputs.streaming is None
            and len(inputs.seq_lens) == 1
            and len(inputs.sampled_rows) == 1
            and int(inputs.slot_mapping[0]) >= 0
        )

    @torch.inference_mode()
    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        model = self.model
        seq_len = int(inputs.seq_lens[0])
        position = int(inputs.positions[0])
        slot = int(inputs.slot_mapping[0])
        if (native := self.native) is not None:
            table = inputs.block_tables[0]
            token = int(inputs.input_ids[0])

            def step() -> torch.Tensor:
                normed = native(token, position, slot, table, seq_len, self.block_size)
                return model.compute_logits(normed)

            return step() if self.tuner is None else self.tuner.run(step)
        hidden = model.embed(torch.from_numpy(inputs.input_ids[:1]))
        # [cos | cos] and [-sin | sin]: x cos2 + roll(x) sin2 = [x1 cos - x2 sin | x2 cos + x1 sin]
        # with HF's roundings (x2 (-sin) is -(x2 sin) exactly; a sum's order is exact)
        row = self.cos_sin[position : position + 1, None]
        half = row.shape[-1] // 2
        cos, sin = row[..., :half], row[..., half:]
        cos2, sin2 = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
        keys = self._keys(inputs.block_tables[0], seq_len)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = self._layer(layer, hidden, residual, cos2, sin2, slot, keys, seq_len)
        assert residual is not None
        out: torch.Tensor = model.ops.rms_norm(hidden, model.norm, self.eps, residual)[0]
        return model.compute_logits(out)

    def _keys(self, table: np.ndarray, seq_len: int) -> int | torch.Tensor:
        """Where the sequence's keys are: the first token row when its blocks are consecutive
        (K and V are then views), else its block ids."""
        blocks = table[: -(-seq_len // self.block_size)]
        first = int(blocks[0])
        if int(blocks[-1]) - first == len(blocks) - 1 and bool((np.diff(blocks) == 1).all()):
            return first * self.block_size
        return torch.from_numpy(blocks.astype(np.int64))

    def _kv(self, flat: torch.Tensor, keys: int | torch.Tensor, seq_len: int) -> torch.Tensor:
        """[1, Hkv, seq_len, D]: a view of the pool, or a gather of the sequence's blocks."""
        hkv, d = self.num_kv_heads, self.head_dim
        if isinstance(keys, int):
            offset = flat.storage_offset() + keys * hkv * d
            return flat.as_strided((1, hkv, seq_len, d), (seq_len * hkv * d, d, hkv * d, 1), offset)
        rows = flat.view(-1, self.block_size, hkv, d).index_select(0, keys)
        return rows.view(1, -1, hkv, d)[:, :seq_len].transpose(1, 2)

    def _layer(
        self,
        layer: _Layer,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos2: torch.Tensor,
        sin2: torch.Tensor,
        slot: int,
        keys: int | torch.Tensor,
        seq_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer on one row; `hidden` may be the bf16 output of the last down
        projection (the residual add promotes it exactly)."""
        x = hidden if residual is None else hidden + residual
        qkv = layer.qkv(self._norm(x, layer.input_norm, self._act_hidden)).float()
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        # rotary on q and k side by side, as kernels/reference.py rotates them
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qk = qkv[:, : self.q_size + self.kv_size].view(1, hq + hkv, d)
        qk = torch.roll(qk, d // 2, -1).mul_(sin2).add_(qk * cos2)
        v = qkv[:, self.q_size + self.kv_size :].view(1, hkv, d)
        layer.flat_k[slot].copy_(qk[0, hq:])
        layer.flat_v[slot].copy_(v[0])
        attn = F.scaled_dot_product_attention(
            qk[:, :hq, None, :],
            self._kv(layer.flat_k, keys, seq_len),
            self._kv(layer.flat_v, keys, seq_len),
            scale=layer.scale,
            enable_gqa=True,
        )
        hidden = layer.o(attn.reshape(1, self.q_size).to(self.act_dtype).contiguous())
        x = hidden + x
        gate_up = layer.gate_up(self._norm(x, layer.post_norm, self._act_hidden))
        gate = F.silu(gate_up[:, : self.intermediate].float(), inplace=True)
        act = torch.mul(gate, gate_up[:, self.intermediate :], out=self._act_inter)
        return layer.down(act), x

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """rms_norm(x) * weight as kernels/reference.py computes it in fp32, written into `out`
        (the int4 matmul's input; rounded once when that is bf16)."""
        # x * x is pow(x, 2)'s own kernel, sum then div_ is mean's on the CPU: same bits
        normed = x * (x * x).sum(-1, keepdim=True).div_(x.shape[-1]).add_(self.eps).rsqrt_()
        return torch.mul(weight, normed, out=out)
