"""Which rotary table each layer of a Llama-shaped model reads, from config.json.

    scaling      rope_scaling (transformers 4) or rope_parameters (5): default, linear, llama3,
                 yarn (Qwen3's and Qwen2.5's long-context setting) or longrope (Phi-3.5,
                 Phi-4-mini: kernels/longrope.py); original_max_position_embeddings defaults
                 to max_position_embeddings, the factor to their ratio, as transformers reads
                 them (Phi-3 keeps the former beside rope_scaling, and it wins there);
                 dynamic (NTK, InternLM3) is transformers' default rotation up to
                 max_position_embeddings, where it rescales by the sequence's length: troupe
                 serves it as default and no longer (gpu/runner_setup.py's limit)
    OLMo 3       rope_parameters per layer type: the full-attention layers take the scaling,
                 the sliding ones rotate unscaled on the same base (the "local" table)
    SmolLM3      no_rope_layers[i] == 0: layer i has no positional encoding (NoPE); it reads a
                 table of cos 1 and sin 0, which leaves q and k as they are
    EXAONE 4     with sliding windows, its full-attention layers are NoPE layers
    partial      RoPE on the first rotary_dim dims of a head (partial_rotary_factor: Phi-4-mini,
                 GLM-4), in halves (Phi-3) or in interleaved pairs (2i, 2i + 1: GLM-4; ERNIE 4.5
                 over the whole head)

The kernels rotate a whole head in halves, dim i with dim i + head_dim / 2. A model that rotates
otherwise gets its q and k dims reordered at load (`head_order`: q/k rows, biases, norms, LoRA
B rows) so that each rotated pair sits at (i, i + head_dim / 2), the dims that are not rotated in
the places left, and its table is widened with cos 1 and sin 0 there (`rope_table`). Scores are
sums over a head's dims, so q.k is unchanged by the order; v and o_proj are not touched.

Gemma 3's local base is read in gpu/hf_families.py, DeepSeek's yarn in gpu/deepseek_config.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import torch
from troupe.kernels.rope_cache import build_cos_sin_cache

SCALINGS = ("linear", "llama3", "yarn", "longrope")
RopeTable = Literal["cos_sin_cache", "cos_sin_local", "cos_sin_none"]


def rope_scaling(scaling: dict[str, Any] | None, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The scaling a table is built with (no rope_theta in it), None for plain RoPE;
    ValueError naming an unsupported type or a yarn scaling without a factor to derive."""
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", "dynamic"):  # dynamic NTK: as default up to max_position_embeddings
        return None
    if kind not in SCALINGS:
        raise ValueError(
            f"config.json: rope_scaling type {kind!r} is not supported; "
            f"expected one of default, dynamic, {', '.join(SCALINGS)}"
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
    if kind == "longrope":
        out |= _longrope_lengths(out, cfg)
    return out


def _longrope_lengths(scaling: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """longrope's pretraining length (Phi-3's top-level original_max_position_embeddings
    first, as transformers reads it) and factor (default: max_position_embeddings over it)."""
    max_positions = cfg.get("max_position_embeddings")
    original = (
        cfg.get("original_max_position_embeddings")
        or scaling.get("original_max_position_embeddings")
        or max_positions
    )
    if not isinstance(original, int | float) or original <= 0:
        raise ValueError(
            "config.json: rope_scaling of type longrope needs original_max_position_embeddings "
            "(or max_position_embeddings)"
        )
    factor = scaling.get("factor")
    if factor is None:
        factor = max_positions / original if isinstance(max_positions, int | float) else 1.0
    for key in ("short_factor", "long_factor"):
        if not isinstance(scaling.get(key), list):
            raise ValueError(f"config.json: rope_scaling of type longrope needs a list {key!r}")
    return {"original_max_position_embeddings": original, "factor": factor}


def check_longrope(scaling: dict[str, Any] | None, rotary_dim: int) -> None:
    """ValueError unless a longrope scaling has a factor for each rotated pair of dims."""
    if scaling is None or scaling.get("rope_type", scaling.get("type")) != "longrope":
        return
    for key in ("short_factor", "long_factor"):
        if len(scaling[key]) != rotary_dim // 2:
            raise ValueError(
                f"config.json: rope_scaling {key} has {len(scaling[key])} entries; expected "
                f"{rotary_dim // 2} (half the {rotary_dim} rotated dims of a head)"
            )


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


def exaone4_fields(windows: tuple[int, ...]) -> dict[str, Any]:
    """EXAONE 4's NoPE layers: the global ones of a model with windows (none without)."""
    return {"nope_layers": tuple(not window for window in windows) if windows else ()}


# the families whose transformers module rotates part of a head; those rotating pairs
PARTIAL_ROTARY = ("phi3", "glm", "glm4", "glm4_moe", "nemotron", "minimax_m2")
INTERLEAVED = ("glm", "glm4", "ernie4_5", "ernie4_5_moe", "helium", "cohere", "cohere2")


def partial_rotary_fields(factor: float, head_dim: int, model_type: str) -> dict[str, Any]:
    """ModelConfig's rotary_dim and rope_interleaved (GLM-4 and ERNIE 4.5 rotate pairs)."""
    interleaved = model_type in INTERLEAVED
    if factor == 1.0 and not interleaved:
        return {}
    if factor != 1.0 and model_type not in PARTIAL_ROTARY:
        raise ValueError(
            f"config.json: partial_rotary_factor {factor} is not supported for model_type "
            f"{model_type!r} (only {', '.join(PARTIAL_ROTARY)})"
        )
    rotary = int(head_dim * factor)
    if not 2 <= rotary <= head_dim or rotary % 2:
        raise ValueError(
            f"config.json: partial_rotary_factor {factor} rotates {rotary} of head_dim "
            f"{head_dim} dims; expected an even number from 2 to {head_dim}"
        )
    return {"rotary_dim": rotary, "rope_interleaved": interleaved}


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


def rope_table(
    head_dim: int,
    rotary_dim: int,
    max_positions: int,
    theta: float,
    scaling: dict[str, Any] | None,
    device: torch.device | str,
) -> torch.Tensor:
    """[max_positions, head_dim] fp32: the table of the first rotary_dim dims (in head_order),
    cos 1 and sin 0 at the dims that are not rotated."""
    table = build_cos_sin_cache(rotary_dim, max_positions, theta, scaling, torch.float32, device)
    half, rotated = head_dim // 2, rotary_dim // 2
    if rotated == half:
        return table
    cos = torch.ones(max_positions, half, device=device)
    sin = torch.zeros(max_positions, half, device=device)
    cos[:, :rotated], sin[:, :rotated] = table[:, :rotated], table[:, rotated:]
    return torch.cat([cos, sin], dim=1)


def head_order(head_dim: int, rotary_dim: int, interleaved: bool) -> tuple[int, ...] | None:
    """Position p of a reordered head holds the checkpoint's dim order[p] (module docstring);
    None when the checkpoint already rotates the whole head in halves."""
    if rotary_dim == head_dim and not interleaved:
        return None
    half, rotated = head_dim // 2, rotary_dim // 2
    pairs = [(2 * i, 2 * i + 1) if interleaved else (i, i + rotated) for i in range(rotated)]
    rest = list(range(rotary_dim, head_dim))
    first = [a for a, _ in pairs] + rest[: half - rotated]
    second = [b for _, b in pairs] + rest[half - rotated :]
    return (*first, *second)


def order_heads(tensor: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """Rows of q or k (a projection, its bias, LoRA's B, a norm over one head or all heads)
    with each head's dims in `order`."""
    dim = len(order)
    heads = tensor.shape[0] // dim
    index = torch.tensor(order, device=tensor.device)
    return tensor.reshape(heads, dim, *tensor.shape[1:])[:, index].reshape(tensor.shape)


_ORDERED = frozenset(
    f"self_attn.{name}" for name in
    ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias", "q_norm.weight",
     "k_norm.weight")
)  # fmt: skip


def ordered_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], order: tuple[int, ...] | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's HF-named tensors with the q/k ones in head order (the rest as they are)."""
    if order is None:
        yield from tensors
        return
    for name, tensor in tensors:
        parts = name.split(".")
        if parts[1:2] == ["layers"] and ".".join(parts[3:]) in _ORDERED:
            if name.endswith("norm.weight"):  # per head ([heads, head_dim]: Command R+'s) or one
                tensor = order_heads(tensor.reshape(-1), order).reshape(tensor.shape)
            else:
                tensor = order_heads(tensor, order)
        yield name, tensor
