"""The language model inside a multimodal checkpoint, served on its own (text in, text out),
of a family troupe runs:

    gemma3                       Gemma 3 4B to 27B
    mistral3                     Mistral Small 3.1 / 3.2
    llava, llava_next,           LLaVA-style checkpoints (OneVision: a Qwen2)
    llava_onevision
    qwen2_vl, qwen2_5_vl         Qwen2-VL and Qwen2.5-VL: a Qwen2
    qwen3_vl, qwen3_vl_moe       Qwen3-VL: a Qwen3, or a Qwen3-MoE whose top-k is always
                                 renormalised and whose hub files hold the fused experts
                                 [E, H, 2I] / [E, I, H] (gpu/weight_fill.py turns them)
    smolvlm, idefics3            SmolVLM and Idefics3: a Llama
    internvl                     InternVL in transformers' format: its text_config's family,
                                 a Qwen2 unless named

    config.json  the wrapper's `text_config` is the model's config; eos_token_id,
                 tie_word_embeddings and the dtype come from the wrapper where the text config
                 does not set them. Gemma 3's hub configs leave out what Gemma3TextConfig
                 defaults (heads, head_dim, vocabulary, ...): those defaults fill them.
                 Qwen2(.5)-VL's older configs hold the text fields at the top level; the Qwen
                 VLs' M-RoPE (rope type "mrope", mrope_section, Qwen3-VL's interleaved) gives
                 a text token the same position on its three axes, which is plain RoPE: read
                 as such
    tensors      language_model.model.* (as checkpoints are saved) and model.language_model.*
                 (transformers 5's own names) and model.text_model.* (SmolVLM's) are the text
                 model's model.*, and
                 language_model.lm_head.weight its lm_head; the vision tower and the projector
                 (Qwen's visual.*, model.visual.*; SmolVLM's model.connector.*; LLaVA-NeXT's
                 image_newline) are not read

The loader's entry points rename as they read (gpu/weight_fill.py, gpu/quant_install.py);
tensor parallelism and pipeline stages refuse such checkpoints by name. `text_name` reads
EXAONE's GPT-style names as Llama's too (gpu/exaone_names.py), the one renaming seam.
"""

from __future__ import annotations

from typing import Any

from troupe.gpu.exaone_names import exaone_name

# wrapper model_type -> the text config's model_type when it does not name one
WRAPPERS = {
    "gemma3": "gemma3_text",
    "mistral3": "mistral",
    "llava": "llama",
    "llava_next": "llama",
    "llava_onevision": "qwen2",
    "qwen2_vl": "qwen2",
    "qwen2_5_vl": "qwen2",
    "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe",
    "smolvlm": "llama",
    "idefics3": "llama",
    "internvl": "qwen2",
}
# text configs whose model_type names no family of their own
_TEXT_TYPES = {
    "qwen2_vl_text": "qwen2",
    "qwen2_5_vl_text": "qwen2",
    "qwen3_vl_text": "qwen3",
    "qwen3_vl_moe_text": "qwen3_moe",
}
_TOP_LEVEL_TEXT = ("qwen2_vl", "qwen2_5_vl")  # older configs: no text_config
_MROPE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
# transformers' Gemma3TextConfig defaults (the 4B / 12B / 27B text_config relies on them)
_GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
}
_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("model.text_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_NOT_TEXT = (
    "vision_tower.", "model.vision_tower.", "multi_modal_projector.",
    "model.multi_modal_projector.", "vision_model.", "model.vision_model.", "visual.",
    "model.visual.", "model.connector.", "image_newline", "model.image_newline",
)  # fmt: skip


def text_config(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The text model's config.json dict of a multimodal wrapper's; None for any other."""
    wrapper = cfg.get("model_type")
    text = cfg.get("text_config")
    if wrapper in _TOP_LEVEL_TEXT and text is None:
        text = {k: v for k, v in cfg.items() if k not in ("model_type", "vision_config")}
    if wrapper not in WRAPPERS or not isinstance(text, dict):
        return None
    out = {"model_type": WRAPPERS[wrapper], **text}
    out["model_type"] = _TEXT_TYPES.get(out["model_type"], out["model_type"])
    if wrapper in _MROPE:
        out = _plain_rope(out)
    if wrapper == "qwen3_vl_moe":  # transformers' router renormalises, whatever the config says
        out["norm_topk_prob"] = True
    for key in ("eos_token_id", "tie_word_embeddings", "torch_dtype", "dtype"):
        if key in cfg and key not in text:
            out[key] = cfg[key]
    if wrapper == "gemma3":
        out = {**_GEMMA3_TEXT_DEFAULTS, **out}
    out["text_of"] = wrapper
    return out


def _plain_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The Qwen VLs' M-RoPE read as plain RoPE (module docstring): its rope_theta kept."""
    out = dict(cfg)
    for key in ("rope_scaling", "rope_parameters"):
        rope = out.get(key)
        if not isinstance(rope, dict) or "mrope_section" not in rope:
            continue
        out[key] = {k: v for k, v in rope.items() if k == "rope_theta"} or None
    return out


def text_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model's terms; None for the vision parts. A text
    model's own names come back as they are."""
    if name.startswith(_NOT_TEXT):
        return None
    for prefix, replacement in _PREFIXES:
        if name.startswith(prefix):
            return replacement + name.removeprefix(prefix)
    return exaone_name(name) if name.startswith("transformer.") else name
