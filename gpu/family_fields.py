"""The fields of ModelConfig that one family's config.json keys give (gpu/model_config.py reads
the rest, which every family shares): each family's reader, picked by model_type. A family with
none gives {}.
"""

from __future__ import annotations

from typing import Any

from troupe.gpu.deepseek_config import DEEPSEEK_TYPES, deepseek_model_fields
from troupe.gpu.hf_families import (
    COHERE_TYPES,
    GEMMA_TYPES,
    HUNYUAN_TYPES,
    cohere_fields,
    gemma_fields,
    granite_fields,
    hunyuan_fields,
    minimax_m2_fields,
    ministral3_fields,
    starcoder2_fields,
    ungated_fields,
)
from troupe.gpu.moe_config import (
    ernie_moe_fields,
    gpt_oss_fields,
    grouped_moe_fields,
    mixtral_fields,
    olmoe_fields,
    qwen3_moe_fields,
)
from troupe.gpu.rope_layers import exaone4_fields, olmo3_fields, smollm3_fields


def family_fields(
    cfg: dict[str, Any],
    model_type: str,
    num_layers: int,
    windows: tuple[int, ...],
    rope_theta: float,
) -> dict[str, Any]:
    """ModelConfig fields of `model_type`'s own keys (experts, scales, norms, rope quirks);
    `windows`: each layer's (hf_families.layer_windows); ValueError naming a bad key."""
    family: dict[str, Any] = gemma_fields(cfg, model_type) if model_type in GEMMA_TYPES else {}
    if model_type in ("qwen3_moe", "qwen2_moe"):
        family = {"moe": qwen3_moe_fields(cfg, num_layers)}
    if model_type == "mixtral":
        family = {"moe": mixtral_fields(cfg, num_layers)}
    if model_type in ("glm4_moe", "dots1"):
        family = {"moe": grouped_moe_fields(cfg, num_layers)}
    if model_type == "ernie4_5_moe":
        family = {"moe": ernie_moe_fields(cfg, num_layers)}
    if model_type == "granite":
        family = granite_fields(cfg)
    if model_type == "granitemoe":  # Mixtral's experts under Granite's multipliers
        family = granite_fields(cfg) | {"moe": mixtral_fields(cfg, num_layers)}
    if model_type == "olmo3":
        family = olmo3_fields(cfg)
    if model_type == "olmoe":
        clip = cfg.get("clip_qkv")
        family = {
            "moe": olmoe_fields(cfg, num_layers),
            "clip_qkv": None if clip is None else float(clip),
        }
    if model_type == "gpt_oss":
        family = {"moe": gpt_oss_fields(cfg, num_layers), "attention_sinks": True}
    if model_type == "ministral3":
        family = ministral3_fields(cfg.get("rope_scaling") or cfg.get("rope_parameters"))
    if model_type == "smollm3":
        family = smollm3_fields(cfg, num_layers)
    if model_type == "exaone4":
        family = exaone4_fields(windows)
    if model_type in COHERE_TYPES:
        family = cohere_fields(cfg, model_type, windows)
    if model_type in ("starcoder2", "nemotron"):
        family = starcoder2_fields(cfg, model_type)
    if model_type in HUNYUAN_TYPES:
        family = hunyuan_fields(cfg, rope_theta, num_layers)
    if model_type in ("arcee", "apertus"):
        family = ungated_fields(cfg, model_type)
    if model_type == "minimax_m2":
        family = minimax_m2_fields(cfg, num_layers)
    if model_type in DEEPSEEK_TYPES:
        family = deepseek_model_fields(cfg, num_layers)
    return family
