"""An EAGLE head in the speculators format (speculators_format.py) read as the plain EAGLE
layouts gpu/eagle_load.py and gpu/eagle3_load.py take, as vLLM's SpeculatorsConfig does:

    config.json    transformer_layer_config (model_type default "llama"), and on top of it
                   EAGLE-3's draft_vocab_size, target_hidden_size,
                   eagle_aux_hidden_state_layer_ids, norm_before_residual (default true, as
                   vLLM reads this format), norm_before_fc; the architecture Eagle3Speculator
                   becomes vLLM's Eagle3LlamaForCausalLM
    "eagle3"       Eagle3Speculator's tensors are EAGLE-3's names already (fc, layers.N.*,
                   norm, lm_head, embed_tokens, d2t, t2d)
    "eagle"        EagleSpeculator's: fusion_fc.* -> fc.* (fusion_bias: fc.bias),
                   transformer.* -> layers.0.*; layernorms (HASS' embedding_layernorm before
                   fusion_fc, pre_lm_head_layernorm) is refused: the EAGLE-1 head has neither

The verifier the head was trained on (speculators_config.verifier) is logged, and a warning
when its architecture is not the model's: vLLM does not refuse one either (a draft is only
ever a matter of acceptance). Other speculators_model_types (mtp, peagle, dflash, ...) are
refused by name.
"""

from __future__ import annotations

from typing import Any

import structlog
import torch
from troupe.config import ConfigError
from troupe.gpu.model_config import ModelConfig
from troupe.speculators_format import SPECULATORS_TYPES

log = structlog.get_logger("troupe.eagle")

EAGLE3_ARCHITECTURE = "Eagle3LlamaForCausalLM"  # vLLM's, which gpu/eagle3_load.is_eagle3 knows
_EAGLE3_FIELDS = (  # top-level fields of an Eagle3Speculator's config that the loader reads
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "norm_before_fc",
)
_EAGLE1_NAMES = {"fusion_fc.": "fc.", "transformer.": "layers.0."}
_LAYER_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")


def speculators_method(fields: dict[str, Any]) -> str:
    """speculators_model_type, "eagle" or "eagle3"; ConfigError naming any other."""
    method = fields.get("speculators_model_type")
    if method not in SPECULATORS_TYPES:
        raise ConfigError(
            f"draft_model config.json: speculators_model_type {method!r}; troupe loads "
            f"{' and '.join(repr(t) for t in SPECULATORS_TYPES)} heads of the speculators format"
        )
    return str(method)


def plain_config(fields: dict[str, Any]) -> dict[str, Any]:
    """The config.json of the plain layout: the draft layers' config with the head's fields."""
    method = speculators_method(fields)
    layer = fields.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError(
            f"draft_model config.json: speculators_model_type {method!r} needs "
            f"transformer_layer_config (the draft layers' config), got {layer!r}"
        )
    missing = [key for key in _LAYER_KEYS if key not in layer]
    if missing:
        raise ConfigError(
            f"draft_model config.json: transformer_layer_config has no {missing[0]!r}"
        )
    cfg = {"model_type": "llama", **layer}
    if method == "eagle":
        if fields.get("layernorms"):
            raise ConfigError(
                "draft_model config.json: layernorms true (an EAGLE head that normalizes the "
                "token's embedding before fusion_fc, as HASS heads do) is not supported"
            )
        return cfg
    cfg.update({key: fields[key] for key in _EAGLE3_FIELDS if fields.get(key) is not None})
    cfg["norm_before_residual"] = bool(fields.get("norm_before_residual", True))  # vLLM's default
    cfg["architectures"] = [EAGLE3_ARCHITECTURE]
    return cfg


def plain_tensors(
    fields: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The head's tensors under the plain layout's names."""
    if speculators_method(fields) == "eagle3":
        return tensors
    renamed: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        for old, new in _EAGLE1_NAMES.items():
            if name.startswith(old):
                name = new + name.removeprefix(old)
                break
        renamed[name] = tensor
    return renamed


def log_verifier(fields: dict[str, Any], target: ModelConfig) -> None:
    """Log the verifier the head was trained on; a warning when its architecture is not the
    model's (vLLM loads such a head without a word: it only costs acceptance)."""
    spec = fields.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    if not isinstance(verifier, dict):
        return
    name = verifier.get("name_or_path")
    architectures = [str(a) for a in verifier.get("architectures") or ()]
    family = target.model_type.replace("_", "")
    same = any(a.lower().removesuffix("forcausallm") == family for a in architectures)
    if architectures and not same:
        log.warning(
            "eagle_head_verifier_differs",
            verifier=name,
            verifier_architectures=architectures,
            model_type=target.model_type,
        )
    else:
        log.info("eagle_head_verifier", verifier=name, verifier_architectures=architectures)
