"""The vision side of LLaVA-style and Gemma 3 checkpoints (gpu/vision_encoder.py): tiny random
LlavaForConditionalGeneration (CLIP or SigLIP tower; "default" and "full" strategies; one
and two feature layers) and Gemma3ForConditionalGeneration (SigLIP, a 4x4 patch grid pooled
to 2x2), saved by transformers, read back through read_vision_config and the saved tensors:
VisionEncoder's rows equal `get_image_features`' (fp32, CPU). The names other transformers
versions save load the same; a missing tensor, a wrong shape, a wrong pixel size and an
unhandled tower are refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import saved_random_model

TEXT = {
    "hidden_size": 48,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "intermediate_size": 64,
    "vocab_size": 300,
}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}
CLIP = {**VISION, "model_type": "clip_vision_model"}
SIGLIP = {**VISION, "model_type": "siglip_vision_model"}
# name -> (wrapper, wrapper settings); the tokens each image gives
CASES: dict[str, tuple[str, dict[str, Any], int]] = {
    "llava_clip": ("Llava", {"vision_config": CLIP}, 4),
    "llava_clip_full": (
        "Llava",
        {"vision_config": CLIP, "vision_feature_select_strategy": "full",
         "vision_feature_layer": -1, "projector_hidden_act": "quick_gelu"},
        5,
    ),
    "llava_clip_layers": (
        "Llava",
        {"vision_config": CLIP, "vision_feature_layer": [-4, 2], "multimodal_projector_bias": False},
        4,
    ),
    "llava_siglip": ("Llava", {"vision_config": SIGLIP, "vision_feature_select_strategy": "full"}, 4),
    "llava_siglip_default": ("Llava", {"vision_config": SIGLIP}, 3),  # drops a real patch
    "gemma3": (
        "Gemma3",
        {"vision_config": {**SIGLIP, "image_size": 56}, "mm_tokens_per_image": 4,
         "image_token_index": 299},
        4,
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(case name, folder, the HF model in eval mode)."""
    import transformers

    wrapper, settings, _ = CASES[request.param]
    text = TEXT if wrapper == "Gemma3" else {**TEXT, "model_type": "llama"}
    config = getattr(transformers, f"{wrapper}Config")(text_config=text, **settings)
    model_cls = getattr(transformers, f"{wrapper}ForConditionalGeneration")
    folder = tmp_path_factory.mktemp(request.param)
    model = saved_random_model(folder, model_cls, config, norms=True, biases=True)
    return request.param, folder, model


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    from troupe.gpu.vision_encoder import is_vision_tensor

    tensors = load_file(str(folder / "model.safetensors"))
    return {k: v for k, v in tensors.items() if is_vision_tensor(k)}


def _encoder(folder: Path, tensors: dict[str, torch.Tensor] | None = None) -> Any:
    from troupe.gpu.vision_config import read_vision_config
    from troupe.gpu.vision_encoder import VisionEncoder

    config = read_vision_config(json.loads((folder / "config.json").read_text()))
    assert config is not None
    encoder = VisionEncoder(config, torch.float32, torch.device("cpu"))
    encoder.load((tensors if tensors is not None else _tensors(folder)).items())
    return encoder


def _pixels(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


def _hf_features(model: Any, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        rows = model.get_image_features(pixel_values=pixels).pooler_output
    return torch.stack(list(rows))  # LLaVA answers a list of [T, D], one per image


def test_rows_match_hf(saved: tuple[str, Path, Any]) -> None:
    name, folder, model = saved
    encoder = _encoder(folder)
    pixels = _pixels(encoder.config.image_size)
    want = _hf_features(model, pixels)
    got = encoder(pixels.double())  # any float dtype in, the encoder's out
    assert got.dtype == torch.float32 and want.std() > 0.1
    assert got.shape == want.shape == (2, CASES[name][2], TEXT["hidden_size"])
    assert encoder.tokens_per_image == CASES[name][2]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_only_the_layers_read_are_built(saved: tuple[str, Path, Any]) -> None:
    name, folder, _ = saved
    encoder = _encoder(folder)
    built = {"llava_clip": 2, "llava_clip_full": 3, "llava_clip_layers": 2, "gemma3": 3}
    assert len(encoder.vision_tower.encoder.layers) == built.get(name, 2)
    assert (encoder.vision_tower.post_layernorm is not None) == (name == "gemma3")


@pytest.mark.parametrize("saved", ["llava_clip", "gemma3"], indirect=True)
@pytest.mark.parametrize(
    "tower, projector",
    [("vision_tower.vision_model.", "multi_modal_projector."),  # transformers 4's hub files
     ("model.vision_tower.vision_model.", "model.multi_modal_projector."),  # 4.5x's own
     ("model.vision_tower.", "model.multi_modal_projector.")],  # transformers 5's own
)  # fmt: skip
def test_other_names_load_the_same(
    saved: tuple[str, Path, Any], tower: str, projector: str
) -> None:
    _, folder, model = saved
    renamed = {}
    for key, tensor in _tensors(folder).items():
        key = key.replace("vision_tower.", tower, 1).replace("multi_modal_projector.", projector, 1)
        renamed[key] = tensor
    encoder = _encoder(folder, renamed)
    pixels = _pixels(encoder.config.image_size)
    torch.testing.assert_close(encoder(pixels), _hf_features(model, pixels), atol=1e-5, rtol=1e-5)


def test_bf16_runs_and_stays_close(saved: tuple[str, Path, Any]) -> None:
    from troupe.gpu.vision_config import read_vision_config
    from troupe.gpu.vision_encoder import VisionEncoder

    _, folder, model = saved
    config = read_vision_config(json.loads((folder / "config.json").read_text()))
    assert config is not None
    encoder = VisionEncoder(config, torch.bfloat16, torch.device("cpu"))
    encoder.load(_tensors(folder).items())
    pixels = _pixels(config.image_size)
    got = encoder(pixels)
    want = _hf_features(model, pixels)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() < 0.05 * want.abs().max()


@pytest.mark.parametrize("saved", ["gemma3"], indirect=True)
def test_refusals_name_the_thing(saved: tuple[str, Path, Any]) -> None:
    _, folder, _ = saved
    tensors = _tensors(folder)
    name = "vision_tower.encoder.layers.1.mlp.fc1.bias"
    with pytest.raises(ValueError, match=rf"missing vision tensors: {name}"):
        _encoder(folder, {k: v for k, v in tensors.items() if k != name})
    bad = {**tensors, name: torch.zeros(7)}
    with pytest.raises(ValueError, match=rf"{name}: shape \[7\], the config makes it \[64\]"):
        _encoder(folder, bad)
    with pytest.raises(ValueError, match=r"vision_tower.encoder.layers.0.mlp.fc3.weight: no such"):
        _encoder(folder, {**tensors, "vision_tower.encoder.layers.0.mlp.fc3.weight": tensors[name]})
    with pytest.raises(ValueError, match=r"lm_head.weight: not a vision tensor"):
        _encoder(folder, {**tensors, "lm_head.weight": tensors[name]})
    encoder = _encoder(folder)
    with pytest.raises(ValueError, match=r"pixels of shape \[1, 3, 28, 28\].*\[N, 3, 56, 56\]"):
        encoder(torch.zeros(1, 3, 28, 28))


def test_unhandled_configs_are_refused_by_field() -> None:
    from troupe.gpu.vision_config import read_vision_config

    pixtral = {"model_type": "llava", "vision_config": {"model_type": "pixtral"}}
    with pytest.raises(ValueError, match=r"vision_config\.model_type 'pixtral'"):
        read_vision_config(pixtral)
    clip_gemma = {"model_type": "gemma3", "vision_config": {"model_type": "clip_vision_model"}}
    with pytest.raises(ValueError, match=r"vision_config\.model_type 'clip_vision_model'"):
        read_vision_config(clip_gemma)
    pooling = {"model_type": "gemma3", "vision_config": {}, "mm_tokens_per_image": 5}
    with pytest.raises(ValueError, match="mm_tokens_per_image 5"):
        read_vision_config(pooling)
    deep = {"model_type": "llava", "vision_config": {}, "vision_feature_layer": -14}
    with pytest.raises(ValueError, match="vision_feature_layer -14"):
        read_vision_config(deep)
    assert read_vision_config({"model_type": "qwen2_vl", "vision_config": {"depth": 1}}) is None
    assert read_vision_config({"model_type": "llava"}) is None


def test_hub_configs_fill_transformers_defaults() -> None:
    """llava-1.5-7b-hf's and gemma-3-4b-it's config.json as shipped (trimmed)."""
    from troupe.gpu.vision_config import read_vision_config

    llava = read_vision_config({
        "model_type": "llava", "image_token_index": 32000,
        "text_config": {"model_type": "llama", "vocab_size": 32064},
        "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                          "model_type": "clip_vision_model", "num_attention_heads": 16,
                          "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768},
    })  # fmt: skip
    assert llava is not None and llava.tower == "clip" and llava.hidden_act == "quick_gelu"
    assert (llava.text_hidden_size, llava.tokens_per_image, llava.num_layers_run) == (4096, 576, 23)
    assert (llava.projector_hidden_act, llava.multimodal_projector_bias) == ("gelu", True)
    assert llava.layer_norm_eps == 1e-5 and llava.image_token_index == 32000
    gemma = read_vision_config({
        "model_type": "gemma3", "mm_tokens_per_image": 256,
        "text_config": {"hidden_size": 2560, "model_type": "gemma3_text"},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16,
                          "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False},
    })  # fmt: skip
    assert gemma is not None and gemma.tower == "siglip"
    assert (gemma.hidden_act, gemma.layer_norm_eps) == ("gelu_pytorch_tanh", 1e-6)
    assert (gemma.tokens_per_image, gemma.text_hidden_size, gemma.image_token_index) == (
        256, 2560, 262_144
    )  # fmt: skip
