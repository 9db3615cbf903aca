"""Which rotary table each layer of a Llama-shaped model reads, from config.json.

    scaling      rope_scaling (transformers 4) or rope_parameters (5): default, linear, llama3
                 or yarn (Qwen3's and Qwen2.5's long-context setting); yarn's
                 original_max_position_embeddings defaults to max_position_embeddings, its
                 factor to their ratio, as transformers reads them
    OLMo 3       rope_parameters per layer type: the full-attention layers take the scaling,
                 the sliding ones rotate unscaled on the same base (the "local" table)
    SmolLM3      no_rope_layers[i] == 0: layer i has no positional encoding (NoPE); it reads a
                 table of cos 1 and sin 0, which leaves q and k as they are

Gemma 3's local base is read in gpu/hf_families.py, DeepSeek's yarn in gpu/deepseek_config.py.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from troupe.kernels.rope_cache import build_cos_sin_cache

SCALINGS = ("linear", "llama3", "yarn")
RopeTable = Literal["cos_sin_cache", "cos_sin_local", "cos_sin_none"]


def rope_scaling(scaling: dict[str, Any] | None, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The scaling a table is built with (no rope_theta in it), None for plain RoPE;
    ValueError naming an unsupported type or a yarn scaling without a factor to derive."""
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind not in SCALINGS:
        raise ValueError(
            f"config.json: rope_scaling type {kind!r} is not supported; "
            f"expected one of default, {', '.join(SCALINGS)}"
        )
    out = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if kind == "yarn":
        max_positions = cfg.get("max_position_embeddings")
        original = out.get("original_max_position_embeddings") or max_positions
        if not isinstance(original, int | float) or original <= 0:
            raise ValueError(
                "config.json: rope_scaling of type yarn needs original_max_position_embeddings "
                "(or max_position_embeddings)"
            )
        out["original_max_position_embeddings"] = original
        if out.get("factor") is None:
            if not isinstance(max_positions, int | float):
                raise ValueError("config.json: rope_scaling of type yarn needs 'factor'")
            out["factor"] = max_positions / original
    return out


def olmo3_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig's rope fields of an OLMo 3 config.json (both spellings): the full layers'
    scaling, and the sliding layers' unscaled table on the same base."""
    params = cfg.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {})
    theta = float(full.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    local = dict(params.get("sliding_attention") or {})
    if rope_scaling(local, cfg) is not None:
        raise ValueError("config.json: OLMo 3's sliding_attention layers take no rope scaling")
    scaling = rope_scaling(cfg.get("rope_scaling") or full, cfg)
    local_theta = float(local.get("rope_theta", theta))
    same = scaling is None and local_theta == theta  # one table serves every layer
    return {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rope_local_theta": None if same else local_theta,
    }


def smollm3_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """SmolLM3's NoPE layers: `no_rope_layers` (1: RoPE), or every no_rope_layer_interval-th."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = int(cfg.get("no_rope_layer_interval", 4))
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) != num_layers:
        raise ValueError(
            f"config.json: no_rope_layers has {len(flags)} entries, expected num_hidden_layers "
            f"({num_layers})"
        )
    nope = tuple(not flag for flag in flags)
    return {"nope_layers": nope if any(nope) else ()}


def layer_tables(
    windows: tuple[int, ...], nope: tuple[bool, ...], has_local: bool, num_layers: int
) -> list[RopeTable]:
    """Each layer's table: none for a NoPE layer, the local one for a windowed layer when the
    model has one (Gemma 3, OLMo 3), else the model's."""
    tables: list[RopeTable] = []
    for i in range(num_layers):
        if nope and nope[i]:
            tables.append("cos_sin_none")
        elif has_local and windows and windows[i]:
            tables.append("cos_sin_local")
        else:
            tables.append("cos_sin_cache")
    return tables


def identity_table(head_dim: int, max_positions: int, device: torch.device | str) -> torch.Tensor:
    """[max_positions, head_dim] of cos 1 and sin 0 at every position: one row, broadcast
    (stride 0), so a NoPE model holds no full table for it."""
    row = torch.cat([torch.ones(head_dim // 2), torch.zeros(head_dim // 2)])
    return row.to(device=device).expand(max_positions, head_dim)


def local_table(
    head_dim: int, max_positions: int, theta: float | None, device: torch.device | str
) -> torch.Tensor | None:
    """The unscaled table of the windowed layers, None when the model has none."""
    if theta is None:
        return None
    return build_cos_sin_cache(head_dim, max_positions, theta, None, torch.float32, device)
