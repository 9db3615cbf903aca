"""Mixtral (experts in every layer, Mixtral's checkpoint names block_sparse_moe.experts.<e>.w1 /
w3 / w2, a sliding window) is greedy token-identical to HF transformers (fp32, CPU) through
chunked prefill, from the folder transformers itself saves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.model_config import ModelConfig, ModelLoadError

TINY_MIXTRAL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,  # one expert's
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
    "sliding_window": 8,  # shorter than the prompts: the window matters
}
PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 12


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """transformers' own Mixtral, random weights (std 0.2, so tokens differ), saved as it saves
    checkpoints."""
    import transformers

    torch.manual_seed(0)
    hf_model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**TINY_MIXTRAL))
    with torch.no_grad():
        for param in hf_model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.2)
    folder = tmp_path_factory.mktemp("mixtral")
    hf_model.save_pretrained(folder)
    return folder, hf_model.eval()


def test_config_reads_the_experts() -> None:
    base = {"model_type": "mixtral", **TINY_MIXTRAL}
    config = ModelConfig.from_hf_dict(base)
    moe = config.moe
    assert moe is not None and moe.sparse_layers == (True, True)
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob) == (
        4,
        2,
        48,
        True,
    )
    assert config.layer_windows == (8, 8)
    with pytest.raises(ModelLoadError, match="num_local_experts"):
        ModelConfig.from_hf_dict({k: v for k, v in base.items() if k != "num_local_experts"})


def test_the_checkpoint_names_mixtrals_experts(mixtral: tuple[Path, Any]) -> None:
    from safetensors import safe_open

    folder, _ = mixtral
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight" in names
    assert "model.layers.1.block_sparse_moe.gate.weight" in names


def test_greedy_matches_hf_with_chunked_prefill(mixtral: tuple[Path, Any], mt: Any) -> None:
    folder, hf_model = mixtral
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(folder), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(mixtral: tuple[Path, Any], mt: Any) -> None:
    """The fused Triton MoE and the windowed paged attention on CUDA (fp32, CUDA graphs) give
    transformers' greedy tokens."""
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions
    from troupe.gpu.weights import load_model

    folder, hf_model = mixtral
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    config, model = load_model(folder, torch.float32, torch.device("cuda"), 256)
    options = RunnerOptions(
        block_size=4, num_gpu_blocks=64, max_model_len=256, max_num_seqs=4, mixed_graph_tokens=32
    )
    driver = mt.PlanDriver(ModelRunner(config, model, options), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
