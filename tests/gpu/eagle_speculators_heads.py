"""EAGLE heads in the speculators format for the tests, written from the plain layouts'
folders (tests/gpu/eagle3_heads.py, tests/gpu/eagle_heads.py) as the `speculators` library
saves them: config.json with speculators_model_type, the nested transformer_layer_config, the
head's fields on top and speculators_config (proposal_methods, verifier); tensors named as
Eagle3Speculator / EagleSpeculator name theirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from tests.gpu.eagle_heads import target_tensors

_EAGLE3_FIELDS = (
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "norm_before_residual",
)


def _speculators_config(k: int | None, verifier: str, architectures: list[str]) -> dict[str, Any]:
    method: dict[str, Any] = {"proposal_type": "greedy"}
    if k is not None:
        method["speculative_tokens"] = k
    return {
        "algorithm": "eagle3",
        "proposal_methods": [method],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier, "architectures": architectures},
    }


def _save(folder: Path, config: dict[str, Any], tensors: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def speculators_head3(
    folder: Path,
    plain: Path,
    *,
    k: int | None = 3,
    verifier: str = "Qwen/Qwen2-0.5B",
    architectures: tuple[str, ...] = ("Qwen2ForCausalLM",),
    drop: tuple[str, ...] = (),
    **top: Any,
) -> Path:
    """The EAGLE-3 head of `plain` (tests/gpu/eagle3_heads.py) as an Eagle3Speculator:
    midlayer.* saved as layers.0.*; `drop` leaves tensors out, `top` sets top-level fields
    (None removes one)."""
    layer = json.loads((plain / "config.json").read_text())
    config: dict[str, Any] = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        **{key: layer.pop(key) for key in _EAGLE3_FIELDS if key in layer},
        "speculators_config": _speculators_config(k, verifier, list(architectures)),
    }
    layer.pop("architectures", None)
    config["transformer_layer_config"] = layer
    config.update(top)
    config = {key: value for key, value in config.items() if value is not None}
    tensors = {
        "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name: t
        for name, t in target_tensors(plain).items()
        if name not in drop
    }
    return _save(folder, config, tensors)


def speculators_head1(folder: Path, plain: Path, *, k: int | None = 3, **top: Any) -> Path:
    """The EAGLE-1 head of `plain` (tests/gpu/eagle_heads.py: no layer-0 input norm, no final
    norm) as an EagleSpeculator: fc.* saved as fusion_fc.*, layers.0.* as transformer.*."""
    layer = json.loads((plain / "config.json").read_text())
    layer.pop("architectures", None)
    tensors = target_tensors(plain)
    config: dict[str, Any] = {
        "speculators_model_type": "eagle",
        "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
        "transformer_layer_architecture": "LlamaDecoderLayer",
        "transformer_layer_config": layer,
        "layernorms": False,
        "fusion_bias": "fc.bias" in tensors,
        "speculators_config": _speculators_config(k, "Qwen/Qwen3-0.6B", ["Qwen3ForCausalLM"]),
        **top,
    }
    renamed = {}
    for name, tensor in tensors.items():
        for old, new in (("fc.", "fusion_fc."), ("layers.0.", "transformer.")):
            if name.startswith(old):
                name = new + name.removeprefix(old)
        renamed[name] = tensor
    return _save(folder, config, renamed)
