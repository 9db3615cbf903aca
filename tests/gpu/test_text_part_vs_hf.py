"""The text model of a multimodal checkpoint (gpu/text_part.py): a tiny Gemma 3
Gemma3ForConditionalGeneration (SigLIP tower, projector, windowed and global layers), a
Mistral 3 one, a LLaVA one (CLIP tower, Llama) and Qwen2-VL and Qwen2.5-VL ones (their own
towers, a Qwen2 under M-RoPE), saved as transformers saves them (language_model.model.*,
vision_tower.*, model.visual.*), served text-only: greedy token-identical to
transformers' own model on the same token ids (fp32, CPU); the config comes from text_config;
tensor and pipeline parallelism are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import assert_greedy_matches, saved_random_model

TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "vocab_size": 300,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "pad_token_id": 0,
}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}
GEMMA3_TEXT = {
    "sliding_window": 5,
    "layer_types": ["sliding_attention", "full_attention"],
    "query_pre_attn_scalar": 16,
    "rope_theta": 1000.0,
    "tie_word_embeddings": False,
}
GEMMA3 = {
    "mm_tokens_per_image": 4,
    "image_token_index": 299,
    "boi_token_index": 297,
    "eoi_token_index": 298,
    "tie_word_embeddings": False,
}
MISTRAL3 = {
    "image_token_index": 299,
    "spatial_merge_size": 1,
    "tie_word_embeddings": False,
    "vision_config": {**VISION, "model_type": "pixtral", "head_dim": 16},
}
LLAVA = {
    "image_token_index": 299,
    "tie_word_embeddings": False,
    "vision_config": {**VISION, "model_type": "clip_vision_model", "projection_dim": 32},
}
# M-RoPE: a text token's three positions are equal, so its sections rotate as plain RoPE does
QWEN_VL_TEXT = {
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e3},
    "tie_word_embeddings": False,
}
QWEN2_5_VL = {
    "tie_word_embeddings": False,
    "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                      "out_hidden_size": 64, "fullatt_block_indexes": [0]},
}  # fmt: skip
QWEN3_VL = {
    "tie_word_embeddings": False,
    "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                      "out_hidden_size": 64, "deepstack_visual_indexes": [0],
                      "num_position_embeddings": 16},
}  # fmt: skip
QWEN3_VL_MOE_TEXT = {
    **QWEN_VL_TEXT,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
}
QWEN2_VL = {
    "tie_word_embeddings": False,
    "vision_config": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2},
}
WRAPPERS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "gemma3": ("Gemma3", GEMMA3_TEXT, GEMMA3),
    "mistral3": ("Mistral3", {"rope_theta": 1000.0, "tie_word_embeddings": False}, MISTRAL3),
    "llava": ("Llava", {"model_type": "llama", "rope_theta": 1000.0}, LLAVA),
    "qwen2_5_vl": ("Qwen2_5_VL", QWEN_VL_TEXT, QWEN2_5_VL),
    "qwen2_vl": ("Qwen2VL", QWEN_VL_TEXT, QWEN2_VL),
    # LLaVA-NeXT (a Llama) and LLaVA-OneVision (a Qwen2): image_newline beside the towers
    "llava_next": ("LlavaNext", {"model_type": "llama", "rope_theta": 1000.0}, LLAVA),
    "llava_onevision": (
        "LlavaOnevision",
        {"model_type": "qwen2", "rope_theta": 1000.0, "tie_word_embeddings": False},
        {**LLAVA, "vision_config": {**VISION, "model_type": "siglip_vision_model"}},
    ),
    # SmolVLM / Idefics3: a Llama (SmolLM2 in SmolVLM) as model.text_model, a pixel-shuffle
    # connector
    "smolvlm": ("SmolVLM", {"model_type": "llama", "rope_theta": 1000.0}, {"scale_factor": 2}),
    "idefics3": ("Idefics3", {"model_type": "llama", "rope_theta": 1000.0}, {"scale_factor": 2}),
    # InternVL (transformers' format): a Qwen2 by default, an InternViT tower
    "internvl": (
        "InternVL",
        {"model_type": "qwen2", "rope_theta": 1000.0, "tie_word_embeddings": False},
        {
            "tie_word_embeddings": False,
            "vision_config": {**VISION, "image_size": [28, 28], "patch_size": [14, 14]},
        },
    ),
    # Qwen3-MoE text: 4 experts, 2 a token, the top-k renormalised
    "qwen3_vl_moe": ("Qwen3VLMoe", QWEN3_VL_MOE_TEXT, QWEN3_VL),
    # Qwen3 text (per-head q/k norms) under interleaved M-RoPE
    "qwen3_vl": (
        "Qwen3VL",
        {
            **QWEN_VL_TEXT,
            "rope_parameters": {**QWEN_VL_TEXT["rope_parameters"], "mrope_interleaved": True},
        },
        QWEN3_VL,
    ),
}


@pytest.fixture(scope="module", params=sorted(WRAPPERS))
def wrapper(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    import transformers

    name, text, extra = WRAPPERS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    config = getattr(transformers, f"{name}Config")(
        text_config={**TEXT, **text}, **{"vision_config": VISION, **extra}
    )
    model_cls = getattr(transformers, f"{name}ForConditionalGeneration")
    return request.param, folder, saved_random_model(folder, model_cls, config, norms=True)


def test_greedy_matches_hf_text_only(wrapper: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*wrapper[1:])


def test_the_config_is_the_text_config(wrapper: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    name, folder, _ = wrapper
    config = ModelConfig.from_hf_folder(folder)
    assert config.text_of == name
    types = {"gemma3": "gemma3_text", "mistral3": "mistral", "qwen3_vl": "qwen3"}
    types["qwen3_vl_moe"] = "qwen3_moe"
    types |= dict.fromkeys(("llava", "llava_next", "smolvlm", "idefics3"), "llama")
    assert config.model_type == types.get(name, "qwen2")
    assert (config.num_layers, config.hidden_size, config.vocab_size) == (2, 64, 300)


def test_parallelism_is_refused(wrapper: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.pp_model import PPStageModel
    from troupe.gpu.tp_model import TPDecoderModel

    name, folder, _ = wrapper
    config = ModelConfig.from_hf_folder(folder)
    with pytest.raises(ModelLoadError, match=f"{name} checkpoint: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 0)  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match=f"{name} checkpoint: pipeline parallelism"):
        PPStageModel(None, config, None, torch.float32, torch.device("cpu"), 64)  # type: ignore[arg-type]


def test_text_names() -> None:
    from troupe.gpu.text_part import text_name

    assert text_name("language_model.model.layers.3.mlp.up_proj.weight") == (
        "model.layers.3.mlp.up_proj.weight"
    )
    assert text_name("model.language_model.norm.weight") == "model.norm.weight"
    assert text_name("language_model.lm_head.weight") == "lm_head.weight"
    assert text_name("vision_tower.encoder.layers.0.mlp.fc1.weight") is None
    assert text_name("model.multi_modal_projector.linear_1.weight") is None
    assert text_name("model.layers.0.self_attn.q_proj.weight") == (
        "model.layers.0.self_attn.q_proj.weight"
    )


def test_a_hub_gemma3_config_leaves_gemma_defaults_out() -> None:
    """gemma-3-4b-it's config.json as shipped: a text_config of six keys."""
    from troupe.gpu.model_config import ModelConfig

    config = ModelConfig.from_hf_dict({
        "model_type": "gemma3", "eos_token_id": [1, 106], "torch_dtype": "bfloat16",
        "text_config": {
            "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "vision_config": {"model_type": "siglip_vision_model"},
    })  # fmt: skip
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (8, 4, 256)
    assert config.vocab_size == 262_208 and config.tie_word_embeddings
    assert config.eos_token_ids == (1, 106) and config.torch_dtype == torch.bfloat16
    assert config.layer_windows[:6] == (1024,) * 5 + (0,)
    assert config.rope_scaling == {"factor": 8.0, "rope_type": "linear"}


def test_qwen_vl_top_level_config_and_names() -> None:
    """An older Qwen2.5-VL config.json: the text fields at the top level, M-RoPE as
    rope_scaling; its tower's tensors (visual.*) are not read."""
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.text_part import text_name

    cfg = {
        "model_type": "qwen2_5_vl", **TEXT, "rope_theta": 1e6, "tie_word_embeddings": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "vision_config": QWEN2_5_VL["vision_config"],
    }  # fmt: skip
    config = ModelConfig.from_hf_dict(cfg)
    assert (config.model_type, config.text_of, config.rope_scaling) == ("qwen2", "qwen2_5_vl", None)
    assert config.rope_theta == 1e6 and config.qkv_bias and config.tie_word_embeddings
    assert text_name("visual.blocks.0.attn.qkv.weight") is None
    assert text_name("model.visual.merger.mlp.0.weight") is None
    assert text_name("model.image_newline") is None  # LLaVA-NeXT's
    assert (
        text_name("model.layers.0.self_attn.q_proj.bias") == "model.layers.0.self_attn.q_proj.bias"
    )


@pytest.mark.parametrize("wrapper", ["qwen3_vl_moe"], indirect=True)
def test_qwen3_vl_moe_hub_layout(wrapper: tuple[str, Path, Any], tmp_path: Path) -> None:
    """Qwen3-VL-MoE's hub files hold the fused experts transposed ([E, H, 2I], [E, I, H]),
    which transformers turns at load (and saves back in its own layout): the same folder with
    its experts written the hub's way gives the same greedy tokens."""
    import shutil

    from safetensors.torch import load_file, save_file

    _, folder, hf_model = wrapper
    hub = tmp_path / "hub"
    shutil.copytree(folder, hub)
    tensors = load_file(str(folder / "model.safetensors"))
    experts = [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert experts
    for name in experts:
        tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, str(hub / "model.safetensors"), metadata={"format": "pt"})
    assert_greedy_matches(hub, hf_model)
