"""HunYuan dense (transformers' HunYuanDenseV1ForCausalLM, Hunyuan-0.5B to 7B): q and k
RMS-normalised per head after the rotary (gpu/hunyuan_layer.py folds both norms' weights into
the queries), a "dynamic" rope with a fixed alpha (a moved base). Greedy token-identical to HF
transformers (fp32) through chunked prefill, the norm weights drawn away from 1; the same
weights read as Qwen3 (its q / k norms before the rotary) answer otherwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_family

ROPE = {"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0, "factor": 1.0}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("hunyuan")
    settings = {**TINY, "head_dim": 16, "rope_parameters": ROPE, "attention_bias": True}
    return folder, saved_family(folder, "HunYuanDenseV1", settings, biases=True)


def test_greedy_matches_hf_with_chunked_prefill(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved, device="cuda")


def test_the_config_reads_the_moved_base(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError

    folder, _ = saved
    cfg = json.loads((folder / "config.json").read_text())
    config = ModelConfig.from_hf_dict(cfg)
    assert config.rope_theta == pytest.approx(10000.0 * 1000.0 ** (16 / 14))
    assert config.rope_scaling is None and config.qk_norm and config.scales_queries
    with pytest.raises(ModelLoadError, match="use_cla"):
        ModelConfig.from_hf_dict({**cfg, "use_cla": True})


def test_the_norms_after_the_rotary_matter(saved: tuple[Path, Any], tmp_path: Path) -> None:
    folder, hf_model = saved
    shadow = tmp_path / "as-qwen3"
    shutil.copytree(folder, shadow)
    cfg = json.loads((shadow / "config.json").read_text())
    (shadow / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3"}))
    from safetensors.torch import load_file, save_file

    names = {"query_layernorm": "q_norm", "key_layernorm": "k_norm"}
    tensors = load_file(shadow / "model.safetensors")
    for old, new in names.items():
        tensors = {key.replace(old, new): value for key, value in tensors.items()}
    save_file(tensors, shadow / "model.safetensors")
    with pytest.raises(AssertionError):
        assert_greedy_matches(shadow, hf_model)
