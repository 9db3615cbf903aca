"""EXAONE 3.0 / 3.5 and EXAONE Deep (model_type "exaone"): Llama's layers under GPT-2's names
(transformer.h.<i>.attn.attention.q_proj, ln_1, mlp.c_fc_0 ...) and config keys (num_layers,
layer_norm_epsilon, activation_function), as transformers saves and reads them
(gpu/exaone_names.py). Greedy token-identical to HF transformers (fp32) through chunked
prefill, from the folder transformers saves; the hub's config.json spelling reads the same;
tensor and pipeline parallelism are refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.family_checks import LLAMA3_ROPE, TINY, assert_greedy_matches, saved_random_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import transformers

    if not hasattr(transformers, "ExaoneConfig"):  # older transformers (the device image's)
        pytest.skip("this transformers has no EXAONE 3 model to compare with")
    folder = tmp_path_factory.mktemp("exaone")
    config = transformers.ExaoneConfig(**TINY, rope_parameters=LLAMA3_ROPE)
    return folder, saved_random_model(folder, transformers.LlamaForCausalLM, config, norms=True)


def test_greedy_matches_hf_with_chunked_prefill(saved: tuple[Path, Any]) -> None:
    from safetensors import safe_open

    folder, hf_model = saved
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert "transformer.h.1.attn.attention.out_proj.weight" in set(f.keys())  # GPT-2's
    assert_greedy_matches(folder, hf_model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(saved: tuple[Path, Any]) -> None:
    assert_greedy_matches(*saved, device="cuda")


def test_the_hubs_config_keys(saved: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    cfg = json.loads((saved[0] / "config.json").read_text())
    hub = {k: v for k, v in cfg.items() if k not in ("num_hidden_layers", "rms_norm_eps")}
    hub |= {"num_layers": 2, "layer_norm_epsilon": 1e-5, "activation_function": "silu"}
    config = ModelConfig.from_hf_dict(hub)
    assert config == ModelConfig.from_hf_dict(cfg)
    assert config.num_layers == 2 and config.rope_scaling is not None
    with pytest.raises(ModelLoadError, match="exaone: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 1)  # type: ignore[arg-type]
    from troupe.gpu.pp_model import PPStageModel
    from troupe.gpu.pp_stage import PPStage

    with pytest.raises(ModelLoadError, match="exaone: pipeline parallelism"):
        PPStageModel(
            PPStage.of(config, 0, 2, None), config, None, torch.float32, torch.device("cpu"), 64
        )  # type: ignore[arg-type]


def test_names_read_as_llamas() -> None:
    from troupe.gpu.exaone_names import exaone_name

    assert exaone_name("transformer.wte.weight") == "model.embed_tokens.weight"
    assert exaone_name("transformer.ln_f.weight") == "model.norm.weight"
    assert exaone_name("transformer.h.3.mlp.c_fc_1.weight") == "model.layers.3.mlp.up_proj.weight"
    assert exaone_name("transformer.h.0.attn.attention.out_proj.weight") == (
        "model.layers.0.self_attn.o_proj.weight"
    )
    assert exaone_name("lm_head.weight") == "lm_head.weight"
