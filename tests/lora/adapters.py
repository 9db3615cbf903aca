"""LoRA adapters for tests, made by PEFT itself and saved as PEFT saves them
(adapter_config.json + adapter_model.safetensors): random A and B (PEFT starts B at zero,
which would make an adapter a no-op), so outputs with and without one differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# SmolLM2-135M: hidden 576, 9 query heads and 3 KV heads of 64, MLP 1536, 30 layers
SMOLLM2_SHAPES = {
    "q_proj": (576, 576),
    "k_proj": (192, 576),
    "v_proj": (192, 576),
    "o_proj": (576, 576),
    "gate_proj": (1536, 576),
    "up_proj": (1536, 576),
    "down_proj": (576, 1536),
}


def peft_adapter(
    hf_model: Any,
    folder: Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    targets: tuple[str, ...] = ALL_TARGETS,
    seed: int = 0,
    scale: float = 0.2,
    use_rslora: bool = False,
) -> Any:
    """Save a random adapter of `hf_model` (a transformers model, left unchanged) to `folder`;
    the PEFT model that runs it (the reference), in eval mode."""
    import copy

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
        use_rslora=use_rslora,
    )
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_(noise * scale)
    peft_model.save_pretrained(folder)
    return peft_model.eval()


def raw_adapter(
    folder: Path,
    *,
    num_layers: int,
    shapes: dict[str, tuple[int, int]],
    rank: int = 8,
    alpha: int = 16,
    seed: int = 0,
    scale: float = 0.02,
) -> Path:
    """An adapter written without PEFT (for models transformers does not build from a folder,
    e.g. the default GGUF model): `shapes` maps a target module (q_proj, ..., down_proj) to its
    (out_features, in_features)."""
    import json

    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(num_layers):
        for module, (out_features, in_features) in shapes.items():
            block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{block}.{module}"
            a = torch.randn(rank, in_features, generator=generator) * scale
            b = torch.randn(out_features, rank, generator=generator) * scale
            tensors[f"{key}.lora_A.weight"] = a.contiguous()
            tensors[f"{key}.lora_B.weight"] = b.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": sorted(shapes),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "task_type": "CAUSAL_LM",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
