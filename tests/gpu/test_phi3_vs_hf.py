"""Phi-3 (its checkpoints ship q|k|v and gate|up fused: self_attn.qkv_proj, mlp.gate_up_proj;
a sliding window on every layer) is greedy token-identical to HF transformers (fp32, CPU)
through chunked prefill, from the folder transformers saves; what troupe does not run (an odd
number of rotary dims, partial rotary where transformers has none, Phi-3's long-context
"longrope") is refused by name. Partial rotary itself: tests/gpu/test_rope_layers_vs_hf.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from troupe.gpu.model_config import ModelConfig, ModelLoadError

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_random_model

TINY_PHI3 = {
    **TINY,
    "original_max_position_embeddings": 256,
    "rope_theta": 1000.0,
    "sliding_window": 8,  # shorter than the prompts: the window matters
}


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import transformers

    folder = tmp_path_factory.mktemp("phi3")
    config = transformers.Phi3Config(**TINY_PHI3)
    return folder, saved_random_model(folder, transformers.Phi3ForCausalLM, config)


def test_greedy_matches_hf_from_fused_tensors(phi3: tuple[Path, Any]) -> None:
    from safetensors import safe_open

    folder, hf_model = phi3
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert "model.layers.1.self_attn.qkv_proj.weight" in set(f.keys())  # fused on disk
    assert ModelConfig.from_hf_folder(folder).layer_windows == (8, 8)
    assert_greedy_matches(folder, hf_model)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"partial_rotary_factor": 0.1}, "rotates 1 of head_dim 16 dims"),
        ({"model_type": "llama", "partial_rotary_factor": 0.5}, "not supported for model_type"),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8}}, "longrope"),
    ],
)
def test_what_troupe_does_not_run_is_refused(change: dict[str, Any], named: str) -> None:
    with pytest.raises(ModelLoadError, match=named):
        ModelConfig.from_hf_dict({"model_type": "phi3", **TINY_PHI3, **change})
