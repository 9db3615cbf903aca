"""EngineConfig.hf_overrides (vLLM's --hf-overrides): keys of the model's config.json replaced
before troupe reads it. Serving Qwen3 at 131,072 tokens with YaRN, as its model card asks:

    troupe serve --model Qwen3-8B --max-model-len 131072 --hf-overrides \
      '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 32768}}'

A key's value replaces config.json's whole, but for a nested model config (a multimodal
checkpoint's text_config), whose keys are replaced one by one, as vLLM applies them. What is
replaced is what ModelConfig reads (the shape, rotary, norms, windows, limits); the weights'
own quantization_config is read from the file as shipped. Only an HF folder has a config.json:
a GGUF model with overrides is refused by name (gpu/weights.read_config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from troupe.config import ConfigError

NESTED_CONFIGS = ("text_config",)


def apply_hf_overrides(cfg: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """config.json's dict with `overrides` applied (a new dict; `cfg` is left as it is)."""
    if not overrides:
        return cfg
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"hf_overrides must be a JSON object of config.json keys, got {overrides!r:.200}"
        )
    out = dict(cfg)
    for key, value in overrides.items():
        nested = out.get(key)
        if key in NESTED_CONFIGS and isinstance(value, Mapping) and isinstance(nested, dict):
            out[key] = {**nested, **value}
        else:
            out[key] = value
    return out
