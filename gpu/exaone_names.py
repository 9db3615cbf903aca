"""EXAONE 3.0 / 3.5 (and EXAONE Deep): Llama's layers under GPT-2's names and config keys, read
as Llama's, as transformers reads them (its conversion_mapping's "exaone" renames, its
ExaoneConfig's attribute_map):

    transformer.wte.                -> model.embed_tokens.
    transformer.h.<i>.              -> model.layers.<i>.
    transformer.ln_f.               -> model.norm.
    .ln_1. / .ln_2.                 -> .input_layernorm. / .post_attention_layernorm.
    .attn.attention.{q,k,v}_proj.   -> .self_attn.{q,k,v}_proj.
    .attn.attention.out_proj.       -> .self_attn.o_proj.
    .mlp.c_fc_0. / c_fc_1. / c_proj. -> .mlp.gate_proj. / up_proj. / down_proj.

    num_layers, layer_norm_epsilon, activation_function
                                    -> num_hidden_layers, rms_norm_eps, hidden_act

gpu/text_part.text_name applies the renames where the loader reads names
(gpu/weight_fill.py, gpu/quant_install.py); the tensor-parallel and pipeline readers ask for
Llama's names and refuse EXAONE by name.
"""

from __future__ import annotations

from typing import Any

_PREFIXES = (
    ("transformer.wte.", "model.embed_tokens."),
    ("transformer.h.", "model.layers."),
    ("transformer.ln_f.", "model.norm."),
)
_PARTS = (
    (".attn.attention.out_proj.", ".self_attn.o_proj."),
    (".attn.attention.", ".self_attn."),
    (".ln_1.", ".input_layernorm."),
    (".ln_2.", ".post_attention_layernorm."),
    (".mlp.c_fc_0.", ".mlp.gate_proj."),
    (".mlp.c_fc_1.", ".mlp.up_proj."),
    (".mlp.c_proj.", ".mlp.down_proj."),
)
CONFIG_KEYS = {
    "num_layers": "num_hidden_layers",
    "layer_norm_epsilon": "rms_norm_eps",
    "activation_function": "hidden_act",
}


def exaone_name(name: str) -> str:
    """An EXAONE checkpoint's tensor name as Llama's (others as given)."""
    for prefix, replacement in _PREFIXES:
        if name.startswith(prefix):
            name = replacement + name.removeprefix(prefix)
            break
    else:
        return name
    for part, replacement in _PARTS:
        if part in name:
            return name.replace(part, replacement, 1)
    return name


def exaone_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """An exaone config.json dict with Llama's keys (one already spelled so wins)."""
    if cfg.get("model_type") != "exaone":
        return cfg
    out = dict(cfg)
    for key, canonical in CONFIG_KEYS.items():
        if key in out:
            value = out.pop(key)
            out.setdefault(canonical, value)
    return out
