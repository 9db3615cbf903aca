"""Tiny GPTQ and AWQ checkpoints for the loader tests, packed straight from the published
formats (AutoGPTQ / gptqmodel, AutoAWQ GEMM), and a reference dequantization written from the
same spec, element by element with numpy, independent of troupe's converter
(gpu/gptq_awq_unpack.py).

    GPTQ  qweight [K/8, N] int32: bits 4i.. of word (r, n) hold code of k = 8r + i
          qzeros  [G, N/8] int32: bits 4i.. of word (g, c) hold zero of n = 8c + i
                  (v1 "gptq": stored = zero - 1, masked to 4 bits; "gptq_v2": stored = zero)
          scales  [G, N] fp16, g_idx [K] int32; w[n, k] = (q - zero[g, n]) * scale[g, n]
          8-bit: four codes a word (bits 8i.., low byte first), qweight [K/4, N], qzeros
                  [G, N/4], masked to 8 bits; symmetric zero 128 (4-bit: 8)
    AWQ   qweight [K, N/8] int32: bits 4i.. of word (k, c) hold column 8c + ORDER[i]
          qzeros  [G, N/8] likewise, scales [G, N] fp16; ORDER = 0, 2, 4, 6, 1, 3, 5, 7
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def _rtn(
    w: np.ndarray, sym: bool, min_zero: int, bits: int = 4
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest `bits`-bit of one group's columns w [N, k]: codes [N, k], zero [N],
    fp16 scale [N]."""
    maxq = 2**bits - 1
    if sym:
        scale = (np.abs(w).max(axis=1) * 2 / maxq).astype(np.float16)
        zero = np.full(w.shape[0], (maxq + 1) // 2)
    else:
        lo, hi = np.minimum(w.min(axis=1), 0), np.maximum(w.max(axis=1), 0)
        scale = ((hi - lo) / maxq).astype(np.float16)
        zero = np.clip(np.round(-lo / scale.astype(np.float32)), min_zero, maxq).astype(np.int64)
    s = scale.astype(np.float32)[:, None]
    codes = np.clip(np.round(w / s) + zero[:, None], 0, maxq).astype(np.int64)
    return codes, zero, scale


def _groups(k: int, group_size: int, perm: np.ndarray | None) -> np.ndarray:
    """g_idx [K]: GPTQ's act-order takes groups along `perm` (inputs by importance)."""
    size = k if group_size == -1 else group_size
    if perm is None:
        return np.arange(k) // size
    g_idx = np.empty(k, dtype=np.int64)
    g_idx[perm] = np.arange(k) // size
    return g_idx


def gptq_tensors(
    w: torch.Tensor, group_size: int, sym: bool, v1: bool, perm: np.ndarray | None, bits: int = 4
) -> dict[str, torch.Tensor]:
    """qweight, qzeros, scales, g_idx of weight w [N, K] (fp32), `bits` 4 or 8."""
    wn = w.numpy().astype(np.float32)
    n, k = wn.shape
    g_idx = _groups(k, group_size, perm)
    num_groups = int(g_idx.max()) + 1
    codes = np.zeros((n, k), dtype=np.int64)
    zeros = np.zeros((num_groups, n), dtype=np.int64)
    scales = np.zeros((num_groups, n), dtype=np.float16)
    for g in range(num_groups):
        cols = np.nonzero(g_idx == g)[0]
        c, zeros[g], scales[g] = _rtn(wn[:, cols], sym, 1 if v1 else 0, bits)
        codes[:, cols] = c
    per = 32 // bits  # codes a word
    qweight = np.zeros((k // per, n), dtype=np.uint32)
    for i in range(per):
        qweight |= (codes.T[i::per].astype(np.uint32)) << np.uint32(bits * i)
    stored = (zeros - 1) & (2**bits - 1) if v1 else zeros
    qzeros = np.zeros((num_groups, n // per), dtype=np.uint32)
    for i in range(per):
        qzeros |= stored[:, i::per].astype(np.uint32) << np.uint32(bits * i)
    return {
        "qweight": torch.from_numpy(qweight.view(np.int32)),
        "qzeros": torch.from_numpy(qzeros.view(np.int32)),
        "scales": torch.from_numpy(scales),
        "g_idx": torch.from_numpy(g_idx.astype(np.int32)),
    }


def awq_tensors(w: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """qweight, qzeros, scales of weight w [N, K] (fp32), asymmetric as AutoAWQ makes them."""
    wn = w.numpy().astype(np.float32)
    n, k = wn.shape
    codes = np.zeros((n, k), dtype=np.int64)
    zeros = np.zeros((k // group_size, n), dtype=np.int64)
    scales = np.zeros((k // group_size, n), dtype=np.float16)
    for g in range(k // group_size):
        cols = slice(g * group_size, (g + 1) * group_size)
        codes[:, cols], zeros[g], scales[g] = _rtn(wn[:, cols], sym=False, min_zero=0)
    qweight = np.zeros((k, n // 8), dtype=np.uint32)
    qzeros = np.zeros((k // group_size, n // 8), dtype=np.uint32)
    for i in range(8):
        qweight |= codes.T[:, ORDER[i] :: 8].astype(np.uint32) << np.uint32(4 * i)
        qzeros |= zeros[:, ORDER[i] :: 8].astype(np.uint32) << np.uint32(4 * i)
    return {
        "qweight": torch.from_numpy(qweight.view(np.int32)),
        "qzeros": torch.from_numpy(qzeros.view(np.int32)),
        "scales": torch.from_numpy(scales),
    }


def _nibbles(words: np.ndarray, slot: np.ndarray | int, bits: int = 4) -> np.ndarray:
    """Code `slot` (0..32/bits - 1, per element or one for all) of each uint32 word."""
    shift = np.uint32(bits) * np.asarray(slot, dtype=np.uint32)
    return ((words >> shift) & np.uint32(2**bits - 1)).astype(np.int64)


def reference_gptq(
    t: dict[str, torch.Tensor], group_size: int, desc_act: bool, v1: bool, bits: int = 4
) -> torch.Tensor:
    """w [N, K] fp32 from the GPTQ spec, one input k at a time."""
    qw = t["qweight"].numpy().view(np.uint32)
    qz = t["qzeros"].numpy().view(np.uint32)
    sc = t["scales"].numpy().astype(np.float32)
    g_idx = t["g_idx"].numpy()
    per = 32 // bits
    k, n = qw.shape[0] * per, qw.shape[1]
    cols = np.arange(n)
    out = np.zeros((n, k), dtype=np.float32)
    for kk in range(k):
        g = int(g_idx[kk]) if desc_act else (0 if group_size == -1 else kk // group_size)
        q = _nibbles(qw[kk // per], kk % per, bits)  # [N]
        z = _nibbles(qz[g, cols // per], cols % per, bits) + (1 if v1 else 0)
        out[:, kk] = (q - z).astype(np.float32) * sc[g]
    return torch.from_numpy(out)


def reference_awq(t: dict[str, torch.Tensor], group_size: int) -> torch.Tensor:
    """w [N, K] fp32 from the AWQ spec, one input k at a time."""
    qw = t["qweight"].numpy().view(np.uint32)
    qz = t["qzeros"].numpy().view(np.uint32)
    sc = t["scales"].numpy().astype(np.float32)
    k, n = qw.shape[0], qw.shape[1] * 8
    cols = np.arange(n)
    slot = np.array([ORDER.index(c % 8) for c in cols])  # each column's code in its word
    out = np.zeros((n, k), dtype=np.float32)
    for kk in range(k):
        g = kk // group_size
        q = _nibbles(qw[kk, cols // 8], slot)
        z = _nibbles(qz[g, cols // 8], slot)
        out[:, kk] = (q - z).astype(np.float32) * sc[g]
    return torch.from_numpy(out)


def write_checkpoint(
    folder: Path,
    hf_model: Any,
    quantization_config: dict[str, Any],
    perms: dict[str, np.ndarray] | None = None,
) -> dict[str, torch.Tensor]:
    """Quantize `hf_model`'s projections into `folder` (config.json with the
    quantization_config, model.safetensors), load the reference dequantization back into
    `hf_model`, and return the reference weights by HF name. `perms`: GPTQ act-order input
    orders by projection (e.g. "self_attn.q_proj"), shared where a test wants them shared."""
    from safetensors.torch import save_file

    qc = quantization_config
    method = qc["quant_method"]
    v1 = qc.get("checkpoint_format", "gptq") == "gptq"
    desc_act = bool(qc.get("desc_act", False))
    state = {name: t.detach().clone().contiguous() for name, t in hf_model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        module = name.rsplit(".", 1)[0]
        if not name.endswith(".weight") or not module.endswith(LINEARS):
            out[name] = tensor
            continue
        if method == "awq":
            packed = awq_tensors(tensor, qc["group_size"])
            ref = reference_awq(packed, qc["group_size"])
        else:
            part = module.split(".", 3)[-1]
            perm = (perms or {}).get(part) if desc_act else None
            bits = qc.get("bits", 4)
            packed = gptq_tensors(tensor, qc["group_size"], qc.get("sym", True), v1, perm, bits)
            ref = reference_gptq(packed, qc["group_size"], desc_act, v1, bits)
        out.update((f"{module}.{suffix}", t) for suffix, t in packed.items())
        reference[name] = ref
    if "lm_head.weight" in out and hf_model.config.tie_word_embeddings:
        del out["lm_head.weight"]
    folder.mkdir(parents=True, exist_ok=True)
    save_file(out, str(folder / "model.safetensors"))
    config = hf_model.config.to_dict()
    config["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(config))
    hf_model.load_state_dict({**state, **reference})
    return reference
