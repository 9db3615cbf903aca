"""OLMo 2 (norms after attention and MLP, none before; q and k RMS-normalised across all heads)
is greedy token-identical to HF transformers (fp32, CPU) through chunked prefill and prefix
reuse, from the folder transformers saves; tensor parallelism is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

TINY_OLMO2 = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 12


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import transformers

    torch.manual_seed(0)
    hf_model = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**TINY_OLMO2))
    with torch.no_grad():
        for param in hf_model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.2)
            else:  # the norms too: weights other than 1 must reach the right rows
                param.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("olmo2")
    hf_model.save_pretrained(folder)
    return folder, hf_model.eval()


def test_greedy_matches_hf_with_chunked_prefill(olmo2: tuple[Path, Any], mt: Any) -> None:
    folder, hf_model = olmo2
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(folder), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token


def test_tensor_parallelism_is_refused(olmo2: tuple[Path, Any]) -> None:
    from troupe.gpu.model_config import ModelConfig, ModelLoadError
    from troupe.gpu.tp_model import TPDecoderModel

    folder, _ = olmo2
    config = ModelConfig.from_hf_folder(folder)
    with pytest.raises(ModelLoadError, match="olmo2: tensor parallelism"):
        TPDecoderModel.make_layer(None, config, torch.float32, torch.device("cpu"), 0)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernels_match_hf(olmo2: tuple[Path, Any], mt: Any) -> None:
    """The Triton norms, RoPE and paged attention on CUDA (fp32, CUDA graphs) give
    transformers' greedy tokens."""
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions
    from troupe.gpu.weights import load_model

    folder, hf_model = olmo2
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
