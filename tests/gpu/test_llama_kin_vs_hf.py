"""Llama's kin: families transformers runs with LlamaForCausalLM under a config of their own,
InternLM3 (its biases as `qkv_bias` / `bias` in the hub's config.json, dynamic NTK rope) and
IQuest-Coder, and Meta's CWM (Llama's layers, `layer_types` windows: 4 tokens on layer 0 here,
shorter than the prompts). Greedy token-identical to HF transformers (fp32) through chunked
prefill, from the folder transformers saves, every bias drawn away from 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.family_checks import TINY, assert_greedy_matches, saved_random_model

DYNAMIC = {"rope_type": "dynamic", "factor": 6.0, "rope_theta": 1000.0}
WINDOWS = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "internlm3": ("InternLM3Config", {"attention_bias": True, "mlp_bias": True}),
    "iquestcoder": ("IQuestCoderConfig", {}),
    "cwm": ("CwmConfig", {"mlp_bias": True, **WINDOWS}),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    import transformers

    config_name, extra = FAMILIES[request.param]
    settings = {**TINY, "head_dim": 16, "rope_parameters": DYNAMIC, **extra}
    config = getattr(transformers, config_name)(**settings)
    folder = tmp_path_factory.mktemp(request.param)
    model_cls = transformers.AutoModelForCausalLM.from_config
    hf_model = saved_random_model(folder, model_cls, config, biases=True)
    assert type(hf_model).__name__ in ("LlamaForCausalLM", "CwmForCausalLM")
    return request.param, folder, hf_model


def test_greedy_matches_hf_with_chunked_prefill(family: tuple[str, Path, Any]) -> None:
    assert_greedy_matches(*family[1:])


def test_the_config_reads_biases_windows_and_rope(family: tuple[str, Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig

    name, folder, _ = family
    cfg = json.loads((folder / "config.json").read_text())
    expected = name == "internlm3"
    if expected:  # as internlm/internlm3-8b-instruct's config.json writes them
        cfg["qkv_bias"], cfg["bias"] = cfg.pop("attention_bias"), cfg.pop("mlp_bias")
    config = ModelConfig.from_hf_dict(cfg)
    assert (config.qkv_bias, config.o_bias) == (expected,) * 2
    assert config.mlp_bias == (name != "iquestcoder")
    assert config.rope_scaling is None  # dynamic NTK: plain rotation up to its length
    assert config.layer_windows == ((4, 0) if name == "cwm" else ())
