"""Which integer compressed-tensors checkpoint an HF folder holds (llm-compressor's W4A16,
W8A16, W8A8 "...-quantized.w4a16" folders): its `quantization_config` read and checked, every
variant troupe cannot read refused at load with the field and value named.

    quant_method "compressed-tensors"
    format        "pack-quantized"  int 4 or 8 bits packed in int32 words (gpu/ct_unpack.py)
                  "int-quantized"   int 8 bits as int8 (also "naive-quantized" with int type)
                  "float-quantized" fp8: not read here (None): gpu/fp8_weights.py finds those
                                    weights by their dtype; "dense": nothing quantized (None)
                  "mixed-precision" each config group names its own format
    config_groups {name: {targets, weights: {num_bits, type "int", symmetric,
                                             strategy "group" | "channel" | "tensor",
                                             group_size, actorder}, input_activations}}
    ignore        modules left dense ("lm_head", "re:.*mlp.gate$")

A module's scheme is the first group whose targets match it, unless `ignore` matches it, as
compressed-tensors matches them: "re:<pattern>" by re.match on the module name, "Linear" by
class (every quantized tensor here belongs to a linear), anything else by exact name.
Activation settings are not used: activations stay in the model dtype (weight-only), as
gpu/fp8_weights.py does with fp8 W8A8 folders.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal

from troupe.gpu.model_config import ModelLoadError, read_json_object

METHOD = "compressed-tensors"
INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
_NOT_HERE = ("float-quantized", "dense")  # fp8 (gpu/fp8_weights.py) or nothing quantized
_CLASSES = ("Linear", "Module")  # class-name targets a linear matches
Strategy = Literal["group", "channel", "tensor"]


@dataclasses.dataclass(frozen=True)
class CtWeights:
    """One config group's weight settings (module docstring)."""

    format: str  # "pack-quantized" or "int-quantized" ("naive-quantized" is read as the latter)
    num_bits: int  # 4 or 8 (int-quantized: 8)
    symmetric: bool
    strategy: Strategy
    group_size: int  # strategy "group": inputs a group; otherwise -1
    actorder: str | None = None  # "group" / "weight" / "dynamic": groups may follow weight_g_idx


@dataclasses.dataclass(frozen=True)
class CtFormat:
    """A compressed-tensors folder's integer schemes by target, and the modules it ignores."""

    schemes: tuple[tuple[tuple[str, ...], CtWeights], ...]  # (targets, settings) in order
    ignore: tuple[str, ...]
    source: str  # config.json's path, for errors

    def weights_for(self, module: str) -> CtWeights | None:
        """The settings of linear `module` (its name prefix), None where none applies."""
        if any(_matches(module, target) for target in self.ignore):
            return None
        for targets, weights in self.schemes:
            if any(_matches(module, target) for target in targets):
                return weights
        return None


def _matches(module: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target == module or target in _CLASSES


def read_ct_format(folder: Path) -> CtFormat | None:
    """The folder's integer compressed-tensors settings; None when it is not compressed-tensors
    or holds no integer scheme (fp8 "float-quantized", "dense"); ModelLoadError naming the field
    and value for a variant that is not read here."""
    config_file = folder / "config.json"
    qc = read_json_object(config_file).get("quantization_config")
    if not isinstance(qc, dict) or str(qc.get("quant_method", "")).lower() != METHOD:
        return None
    source = f"{config_file} quantization_config"
    top = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _refuse(source, "config_groups", groups, "an object of quantization groups")
    schemes: list[tuple[tuple[str, ...], CtWeights | None]] = []
    for name, group in groups.items():
        where = f"{source} config_groups.{name}"
        if not isinstance(group, dict):
            raise _refuse(where, "value", group, "an object")
        fmt = group.get("format") or top
        settings = group.get("weights")
        is_float = isinstance(settings, dict) and settings.get("type") == "float"
        if fmt in _NOT_HERE or (is_float and fmt in (None, "naive-quantized")):
            schemes.append((_targets(where, group), None))
            continue
        if fmt not in INT_FORMATS:
            raise _refuse(where, "format", fmt, " or ".join(repr(f) for f in INT_FORMATS))
        schemes.append((_targets(where, group), _weights(where, fmt, group)))
    if all(w is None for _, w in schemes):
        return None
    if any(w is None for _, w in schemes):  # fp8 beside int: two readers at once
        raise _refuse(source, "format", top, "integer groups without float or dense ones beside")
    for field in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if qc.get(field):  # KV scales, 2:4 sparsity, rotations: not read
            raise _refuse(source, field, qc[field], "null (no KV cache, sparsity or transform)")
    kept = tuple((targets, w) for targets, w in schemes if w is not None)
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(t, str) for t in ignore):
        raise _refuse(source, "ignore", ignore, "a list of module names or 're:' patterns")
    return CtFormat(kept, tuple(ignore), str(config_file))


def _refuse(source: str, field: str, value: Any, expected: str) -> ModelLoadError:
    return ModelLoadError(f"{source}: {field} is {value!r}; troupe reads {expected}")


def _targets(where: str, group: dict[str, Any]) -> tuple[str, ...]:
    targets = group.get("targets")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise _refuse(where, "targets", targets, "a list of module names or 're:' patterns")
    return tuple(targets)


def _weights(where: str, fmt: str, group: dict[str, Any]) -> CtWeights:
    w = group.get("weights")
    if not isinstance(w, dict):
        raise _refuse(where, "weights", w, "an object of weight settings")
    if group.get("output_activations"):
        raise _refuse(where, "output_activations", group["output_activations"], "null")
    if w.get("type") != "int":
        raise _refuse(where, "weights.type", w.get("type"), f"'int' for format {fmt!r}")
    bits = w.get("num_bits")
    allowed = (4, 8) if fmt == "pack-quantized" else (8,)
    if type(bits) is not int or bits not in allowed:
        listed = " or ".join(str(b) for b in allowed)
        raise _refuse(where, "weights.num_bits", bits, f"{listed} for format {fmt!r}")
    symmetric = w.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise _refuse(where, "weights.symmetric", symmetric, "true or false")
    strategy = w.get("strategy")
    group_size = -1
    if strategy == "group":
        size = w.get("group_size")
        if type(size) is not int or size <= 0:
            raise _refuse(where, "weights.group_size", size, "a positive integer")
        group_size = size
    elif strategy not in ("channel", "tensor"):
        raise _refuse(where, "weights.strategy", strategy, "'group', 'channel' or 'tensor'")
    actorder = w.get("actorder")
    if actorder is not None and not isinstance(actorder, str):
        raise _refuse(where, "weights.actorder", actorder, "null or a string")
    if w.get("dynamic"):
        raise _refuse(where, "weights.dynamic", w["dynamic"], "false (scales shipped)")
    read_as = "int-quantized" if fmt == "naive-quantized" else fmt
    return CtWeights(read_as, bits, symmetric, strategy, group_size, actorder)
