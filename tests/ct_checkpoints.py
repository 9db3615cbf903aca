"""Tiny compressed-tensors checkpoints for the loader tests (llm-compressor's W4A16 / W8A16
"pack-quantized" and W8A8 "int-quantized" folders), packed straight from compressed-tensors'
format, and a reference dequantization written from the same spec with numpy, element by
element, independent of troupe's converter (gpu/ct_unpack.py).

    pack-quantized  weight_packed [N, ceil(K/p)] int32, p = 32/b: bits b*i.. of word (n, j)
                    hold q[n, p*j + i] + 2^(b-1); weight_shape [N, K] (int64, as torch.tensor
                    of a shape); weight_scale [N, G] bf16; asymmetric: weight_zero_point
                    [ceil(N/p), G] int32, bits b*i.. of word (r, g) hold z[p*r + i, g] + 2^(b-1)
    int-quantized   weight [N, K] int8 = q; weight_scale [N, 1] bf16; input_scale [1] fp32
    actorder group  weight_g_idx [K] int32: input k belongs to group g_idx[k]

    w[n, k] = (q - z) * s[n, g]   (symmetric: z = 0)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gptq_awq_checkpoints import LINEARS


def scheme(
    fmt: str,
    bits: int,
    strategy: str = "group",
    group_size: int | None = 128,
    symmetric: bool = True,
    actorder: str | None = None,
    ignore: tuple[str, ...] = ("lm_head",),
    w8a8: bool = False,
) -> dict[str, Any]:
    """A quantization_config as llm-compressor writes it (one config group, every Linear)."""
    acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor"}
    weights = {
        "num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy,
        "group_size": group_size if strategy == "group" else None, "actorder": actorder,
        "dynamic": False, "observer": "minmax",
    }  # fmt: skip
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts if w8a8 else None,
             "output_activations": None}  # fmt: skip
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status":
            "compressed", "config_groups": {"group_0": group}, "ignore": list(ignore),
            "kv_cache_scheme": None, "sparsity_config": {}}  # fmt: skip


def _ignored(module: str, ignore: list[str]) -> bool:
    return any(re.match(t[3:], module) if t.startswith("re:") else t == module for t in ignore)


def _quantize(
    w: np.ndarray, bits: int, symmetric: bool, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signed codes q [N, K], signed zeros z [N, G], bf16-valued scales s [N, G] (fp32)."""
    lo_q, hi_q = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    n, num_groups = w.shape[0], int(groups.max()) + 1
    q = np.zeros(w.shape, dtype=np.int64)
    z = np.zeros((n, num_groups), dtype=np.int64)
    s = np.zeros((n, num_groups), dtype=np.float32)
    for g in range(num_groups):
        cols = np.nonzero(groups == g)[0]
        part = w[:, cols]
        if symmetric:
            raw = np.abs(part).max(axis=1) / hi_q
        else:
            lo, hi = np.minimum(part.min(axis=1), 0), np.maximum(part.max(axis=1), 0)
            raw = (hi - lo) / (2**bits - 1)
        s[:, g] = _bf16(raw)
        if not symmetric:
            z[:, g] = np.clip(np.round(lo_q - lo / s[:, g]), lo_q, hi_q)
        q[:, cols] = np.clip(np.round(part / s[:, g, None]) + z[:, g, None], lo_q, hi_q)
    return q, z, s


def _bf16(x: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16, as llm-compressor stores scales of a bf16 model."""
    return torch.from_numpy(x.astype(np.float32)).bfloat16().float().numpy()


def _pack_rows(u: np.ndarray, bits: int) -> np.ndarray:
    """uint [R, C] -> int32 [R, ceil(C/p)]: value c of a row in word c // p, bits b*(c % p)."""
    per = 32 // bits
    padded = np.zeros((u.shape[0], -(-u.shape[1] // per) * per), dtype=np.uint32)
    padded[:, : u.shape[1]] = u
    words = np.zeros((u.shape[0], padded.shape[1] // per), dtype=np.uint32)
    for i in range(per):
        words |= padded[:, i::per] << np.uint32(bits * i)
    return words.view(np.int32)


def ct_tensors(
    w: torch.Tensor, qc: dict[str, Any], perm: np.ndarray | None = None
) -> dict[str, torch.Tensor]:
    """The compressed tensors of weight w [N, K] (fp32) under `qc` (suffix -> tensor)."""
    args = qc["config_groups"]["group_0"]["weights"]
    bits, sym, strategy = args["num_bits"], args["symmetric"], args["strategy"]
    wn = w.numpy().astype(np.float32)
    n, k = wn.shape
    size = args["group_size"] if strategy == "group" else k
    groups = np.arange(k) // size
    if perm is not None:  # actorder "group": groups follow an order of importance
        groups = np.empty(k, dtype=np.int64)
        groups[perm] = np.arange(k) // size
    if strategy == "tensor":  # one scale for the whole tensor (symmetric)
        hi_q = 2 ** (bits - 1) - 1
        s = _bf16(np.abs(wn).max(keepdims=True).reshape(1) / hi_q)
        q = np.clip(np.round(wn / s[0]), -hi_q - 1, hi_q).astype(np.int64)
        z = np.zeros((n, 1), dtype=np.int64)
    else:
        q, z, s = _quantize(wn, bits, sym, groups)
    scale = torch.from_numpy(s).bfloat16()
    out: dict[str, torch.Tensor] = {"weight_scale": scale}
    offset = 2 ** (bits - 1)
    if qc["format"] == "int-quantized":
        out["weight"] = torch.from_numpy(q.astype(np.int8))
        out["input_scale"] = torch.tensor([0.02])
    else:
        out["weight_packed"] = torch.from_numpy(_pack_rows((q + offset).astype(np.uint32), bits))
        out["weight_shape"] = torch.tensor([n, k])
        if not sym:
            zu = (z + offset).astype(np.uint32)
            out["weight_zero_point"] = torch.from_numpy(_pack_rows(zu.T, bits).T.copy())
    if perm is not None:
        out["weight_g_idx"] = torch.from_numpy(groups.astype(np.int32))
    return out


def reference(t: dict[str, torch.Tensor], qc: dict[str, Any], n: int, k: int) -> torch.Tensor:
    """w [N, K] fp32 from the format spec (module docstring), one input k at a time."""
    args = qc["config_groups"]["group_0"]["weights"]
    bits, sym, strategy = args["num_bits"], args["symmetric"], args["strategy"]
    per, mask, offset = 32 // bits, 2**bits - 1, 2 ** (bits - 1)
    s = t["weight_scale"].float().numpy().reshape(n if strategy != "tensor" else 1, -1)
    rows = np.arange(n)
    out = np.zeros((n, k), dtype=np.float32)
    for kk in range(k):
        if "weight_g_idx" in t:
            g = int(t["weight_g_idx"][kk])
        else:
            g = kk // args["group_size"] if strategy == "group" else 0
        if qc["format"] == "int-quantized":
            q = t["weight"][:, kk].numpy().astype(np.int64)
        else:
            words = t["weight_packed"].numpy().view(np.uint32)[:, kk // per]
            q = ((words >> np.uint32(bits * (kk % per))) & mask).astype(np.int64) - offset
        z = np.zeros(n, dtype=np.int64)
        if not sym:
            zw = t["weight_zero_point"].numpy().view(np.uint32)[rows // per, g]
            shift = np.uint32(bits) * (rows % per).astype(np.uint32)
            z = ((zw >> shift) & mask).astype(np.int64) - offset
        scale = s[:, g] if strategy != "tensor" else s[0, 0]
        out[:, kk] = (q - z).astype(np.float32) * scale
    return torch.from_numpy(out)


def write_ct_checkpoint(
    folder: Path, hf_model: Any, qc: dict[str, Any], perm_seed: int | None = None
) -> dict[str, torch.Tensor]:
    """Quantize every linear of `hf_model` the config targets (projections and an untied
    lm_head, unless ignored) into `folder`, load the reference dequantization back into
    `hf_model`, and return the reference weights by HF name. `perm_seed`: actorder "group"
    input orders, one per input width (shared by the parts of a fused projection)."""
    from safetensors.torch import save_file

    state = {name: t.detach().clone().contiguous() for name, t in hf_model.state_dict().items()}
    if hf_model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    rng = np.random.default_rng(perm_seed)
    perms: dict[int, np.ndarray] = {}
    out: dict[str, torch.Tensor] = {}
    refs: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        module = name.rsplit(".", 1)[0]
        linear = module.endswith(LINEARS) or module == "lm_head"
        if not name.endswith(".weight") or not linear or _ignored(module, qc["ignore"]):
            out[name] = tensor
            continue
        k = tensor.shape[1]
        perm = None if perm_seed is None else perms.setdefault(k, rng.permutation(k))
        packed = ct_tensors(tensor, qc, perm)
        out.update((f"{module}.{suffix}", t) for suffix, t in packed.items())
        refs[name] = reference(packed, qc, *tensor.shape)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(out, str(folder / "model.safetensors"))
    config = hf_model.config.to_dict()
    config["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(config))
    hf_model.load_state_dict({**state, **refs}, strict=False)
    return refs
