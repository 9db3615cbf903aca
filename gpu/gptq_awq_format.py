"""Which GPTQ (4- or 8-bit) or AWQ (4-bit) checkpoint an HF folder holds: its
`quantization_config` read and checked, variants troupe cannot read refused at load with the
field and value named.

    GPTQ (quant_method "gptq"; AutoGPTQ / gptqmodel / optimum)   AWQ (quant_method "awq", AutoAWQ)
      bits 4 (gpu/gptq_awq_unpack.py) or 8 (gpu/gptq_int8.py)      bits 4
      group_size 32, 64, 128, ... (a multiple of 32) or -1         group_size a multiple of 32
      desc_act: act-order, groups follow `g_idx`                   zero_point true
      sym: either (the zeros are stored both ways; 8-bit           version "gemm"
           asymmetric or act-order: expanded, not kept)
      checkpoint_format "gptq" (v1: zero = stored + 1) or "gptq_v2" (zero = stored)

Older GPTQ folders carry the settings in `quantize_config.json` beside config.json (AutoGPTQ
before transformers read them); that file is read when config.json has no quantization_config.
A folder with neither, or with another quant_method (fp8 ones are found by their tensors'
dtype: gpu/fp8_weights.py), is not one of these: None.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from troupe.gpu.model_config import ModelLoadError, read_json_object

GROUP = 32  # troupe's int4 groups (gpu/gguf_quant.Int4Blocks): shipped groups repeat per 32
_MARLIN = ("marlin", "gptq_marlin", "awq_marlin")  # serialized for Marlin's kernel layout


@dataclasses.dataclass(frozen=True)
class PackedInt4Format:
    """A GPTQ or AWQ checkpoint's settings (module docstring)."""

    method: Literal["gptq", "awq"]
    group_size: int  # along K; -1: one group per output channel (GPTQ)
    desc_act: bool = False  # GPTQ act-order: input k belongs to group g_idx[k]
    zero_offset: int = 0  # added to each stored zero: 1 for GPTQ v1 checkpoints
    bits: int = 4  # GPTQ: 4 or 8; AWQ: 4
    sym: bool = True  # GPTQ's flag (8-bit: False rules out keeping int8 codes)


def read_packed_int4_format(folder: Path) -> PackedInt4Format | None:
    """The folder's GPTQ / AWQ settings, None when it is neither; ModelLoadError naming the
    field and value for a variant that is not read here."""
    source, qc = _quantization_config(folder)
    if qc is None:
        return None
    method = str(qc.get("quant_method", "gptq" if source.endswith("quantize_config.json") else ""))
    method = method.lower()
    if method in _MARLIN:
        raise ModelLoadError(
            f"{source}: quant_method {method!r} is serialized for Marlin's kernel layout; "
            "troupe reads the plain 'gptq' and 'awq' (GEMM) layouts"
        )
    if method == "gptq":
        return _gptq(source, qc)
    if method == "awq":
        return _awq(source, qc)
    return None


def _quantization_config(folder: Path) -> tuple[str, dict[str, Any] | None]:
    config_file = folder / "config.json"
    qc = read_json_object(config_file).get("quantization_config")
    if isinstance(qc, dict):
        return f"{config_file} quantization_config", qc
    legacy = folder / "quantize_config.json"
    if qc is None and legacy.is_file():
        return str(legacy), read_json_object(legacy)
    return str(config_file), None


def _refuse(source: str, field: str, value: Any, expected: str) -> ModelLoadError:
    return ModelLoadError(f"{source}: {field} is {value!r}; troupe reads {expected}")


def _bits(source: str, qc: dict[str, Any], allowed: tuple[int, ...], *keys: str) -> int:
    key = next((k for k in keys if k in qc), keys[0])
    bits = qc.get(key)
    if type(bits) is not int or bits not in allowed:
        listed = " or ".join(str(b) for b in allowed)
        raise _refuse(source, key, bits, f"{listed}-bit weights only (bits {listed})")
    return bits


def _group(source: str, qc: dict[str, Any], key: str, per_channel: bool) -> int:
    size = qc.get(key)
    if isinstance(size, bool) or not isinstance(size, int):
        raise _refuse(source, key, size, "an integer group size")
    if (size == -1 and per_channel) or (size > 0 and size % GROUP == 0):
        return size
    allowed = "-1 (per channel) or " if per_channel else ""
    raise _refuse(source, key, size, f"{allowed}a multiple of {GROUP} (32, 64, 128, ...)")


def _flag(source: str, qc: dict[str, Any], key: str, default: bool) -> bool:
    value = qc.get(key, default)
    if not isinstance(value, bool):
        raise _refuse(source, key, value, "true or false")
    return value


def _gptq(source: str, qc: dict[str, Any]) -> PackedInt4Format:
    bits = _bits(source, qc, (4, 8), "bits")
    group_size = _group(source, qc, "group_size", per_channel=True)
    desc_act = _flag(source, qc, "desc_act", False)
    sym = _flag(source, qc, "sym", True)  # both store explicit zeros; 8-bit keeps only sym
    if qc.get("is_marlin_format"):
        raise _refuse(source, "is_marlin_format", True, "the plain GPTQ layout")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(source, "checkpoint_format", fmt, "'gptq' (v1) or 'gptq_v2'")
    if qc.get("dynamic"):  # gptqmodel's per-module overrides (other bits or groups per layer)
        raise _refuse(source, "dynamic", qc["dynamic"], "one setting for every module")
    return PackedInt4Format("gptq", group_size, desc_act, 1 if fmt == "gptq" else 0, bits, sym)


def _awq(source: str, qc: dict[str, Any]) -> PackedInt4Format:
    _bits(source, qc, (4,), "bits", "w_bit")
    group_size = _group(source, qc, "group_size" if "group_size" in qc else "q_group_size", False)
    if not _flag(source, qc, "zero_point", True):
        raise _refuse(source, "zero_point", False, "AWQ with zero points (zero_point true)")
    version = qc.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise _refuse(source, "version", version, "AWQ's 'gemm' layout")
    return PackedInt4Format("awq", group_size)
