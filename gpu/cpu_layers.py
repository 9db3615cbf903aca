"""The one-sequence decode path's native form: every decoder layer of a step in one C call.

With the native int4 kernel (gpu/cpu_q4.py), the matmuls of a decode step take about half of it
and the ~25 small torch ops per layer around them (norms, rotary, the KV write, attention, SiLU,
residual adds: ~750 calls of a few microseconds each for SmolLM2's 30 layers) most of the rest.
gpu/cpu_layers.c runs the same arithmetic in one call per step; this module holds its argument
structs, bound once per model (the weights' and pools' addresses) and per step (the token's
row, its rotary row, the block table).

It serves what gpu/cpu_decode.py's torch form serves (plain decoder layers, fp32 weights and
cache) where every projection is a native CpuQ4 weight; `NativeLayers.build` returns None
otherwise. Its logits equal the torch form's up to fp32 summation order
(tests/gpu/test_cpu_decode.py).
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
from troupe.gpu.cpu_q4 import CpuQ4
from troupe.gpu.cpu_q4lib import MIN_SPLIT, Q4Lib
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.lora_linear import base_weight
from troupe.gpu.models import DecoderLayer, DecoderModel
from troupe.gpu.quant_linear import Int4Linear, Projection

_p, _i, _f, _l = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long


class _Weight(ctypes.Structure):
    _fields_ = [("codes", _p), ("factors", _p), ("form", _i), ("n", _i), ("k", _i)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _p), ("post_norm", _p), ("qkv_bias", _p),
        ("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight), ("down", _Weight),
        ("k_pool", _p), ("v_pool", _p), ("scale", _f),
    ]  # fmt: skip


class _Step(ctypes.Structure):
    _fields_ = [
        ("hidden", _i), ("inter", _i), ("hq", _i), ("hkv", _i), ("d", _i),
        ("block_size", _i), ("seq_len", _i), ("threads", _i), ("eps", _f),
        ("slot", _l), ("table", _p), ("cos", _p), ("sin", _p), ("final_norm", _p),
        ("min_split", _l),
        ("x", _p), ("out", _p), ("a", _p), ("qkv", _p), ("scores", _p), ("attn", _p),
        ("gu", _p), ("h", _p),
    ]  # fmt: skip


def _native(weight: Projection) -> CpuQ4 | None:
    if isinstance(weight, Int4Linear) and isinstance(weight.cpu_int4, CpuQ4):
        return weight.cpu_int4
    return None


def _weight(q4: CpuQ4) -> _Weight:
    return _Weight(q4.codes.data_ptr(), q4.factors.data_ptr(), q4.form, q4.num_rows, q4.k)


class NativeLayers:
    """Runs a step's decoder layers for one row: embedding row in, final-normed row out."""

    def __init__(self, model: DecoderModel, lib: Q4Lib, layers: list[_Layer]) -> None:
        c = model.config
        self.model, self.lib = model, lib
        self._layers = (_Layer * len(layers))(*layers)
        self._cos_sin: torch.Tensor = model.get_buffer("cos_sin_cache")
        hidden, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
        self._half = d // 2
        # keep every buffer referenced: the struct holds bare addresses
        self._x = torch.empty(1, hidden)
        self._out = torch.empty(1, hidden)
        self._a = torch.empty(max(hidden, inter))
        self._qkv = torch.empty(c.q_size + 2 * c.kv_size)
        self._attn = torch.empty(c.q_size)
        self._gu = torch.empty(2 * inter)
        self._h = torch.empty(hidden)
        self._scores = torch.empty(0)
        self._table = np.empty(0, dtype=np.int64)
        self._step = _Step(
            hidden=hidden, inter=inter, hq=c.num_heads, hkv=c.num_kv_heads, d=d,
            eps=c.rms_norm_eps, final_norm=model.norm.data_ptr(), min_split=MIN_SPLIT,
            x=self._x.data_ptr(), out=self._out.data_ptr(), a=self._a.data_ptr(),
            qkv=self._qkv.data_ptr(), attn=self._attn.data_ptr(), gu=self._gu.data_ptr(),
            h=self._h.data_ptr(),
        )  # fmt: skip

    @classmethod
    def build(cls, model: DecoderModel, kv: KVCache) -> NativeLayers | None:
        """The native layers of `model` (which gpu/cpu_decode.py's checks have passed), or None
        unless every projection is a CpuQ4 weight."""
        layers: list[_Layer] = []
        lib: Q4Lib | None = None
        for i, layer in enumerate(model.layers):
            if not isinstance(layer, DecoderLayer):
                return None
            projs = [  # under LoRA adapters: the base weights (cpu_decode.py)
                _native(base_weight(w))
                for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
            ]
            if any(p is None for p in projs):
                return None
            qkv, o, gate_up, down = (p for p in projs if p is not None)
            lib = qkv.lib
            k_cache, v_cache = kv.layers[i]
            bias = layer.qkv_bias
            layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.data_ptr(),
                    post_norm=layer.post_attention_layernorm.data_ptr(),
                    qkv_bias=None if bias is None else bias.data_ptr(),
                    qkv=_weight(qkv), o=_weight(o), gate_up=_weight(gate_up),
                    down=_weight(down), k_pool=k_cache.data_ptr(), v_pool=v_cache.data_ptr(),
                    scale=layer.scale,
                )
            )  # fmt: skip
        if lib is None:
            return None
        return cls(model, lib, layers)

    @torch.inference_mode()
    def __call__(
        self, token: int, position: int, slot: int, table: np.ndarray, seq_len: int, block_size: int
    ) -> torch.Tensor:
        """The final-normed hidden row [1, hidden] after the token at `position` (its KV goes to
        pool row `slot`; the sequence's `seq_len` tokens sit in the blocks of `table`)."""
        model, step = self.model, self._step
        self._x.copy_(model.embed(torch.tensor([token])))
        hq = step.hq
        if self._scores.numel() < hq * seq_len:
            self._scores = torch.empty(hq * max(seq_len, 256) * 2)
            step.scores = self._scores.data_ptr()
        self._table = np.ascontiguousarray(table[: -(-seq_len // block_size)], dtype=np.int64)
        row = self._cos_sin[position]
        step.table = self._table.ctypes.data
        step.cos = row.data_ptr()
        step.sin = row.data_ptr() + 4 * self._half
        step.slot, step.seq_len, step.block_size = slot, seq_len, block_size
        step.threads = self.lib.one_row_threads
        if self.lib.layers(self._layers, len(self._layers), ctypes.byref(step)):
            raise MemoryError("native CPU layers: out of memory for the activations")
        return self._out
