"""What the model-family tests against transformers share (Mixtral, Phi-3, Granite, OLMo 2): a
random checkpoint of an HF model class, saved as transformers saves checkpoints, and greedy
agreement with it through chunked prefill, on the CPU runner or on CUDA."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.conftest import PlanDriver, hf_greedy, runner_for

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 12
LLAMA3_ROPE = {  # Llama 3.1's long context on a tiny scale (EXAONE 3.5's, Apertus's)
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# the shape the family tests start from (GQA: 4 query heads over 2 KV heads of 16)
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def saved_random_model(
    folder: Path, model_cls: Any, config: Any, *, norms: bool = False, biases: bool = False
) -> Any:
    """`model_cls(config)` with its matrices drawn N(0, 0.2) (seed 0; `norms`: its vectors
    and norm weights U(0.5, 1.5) too, so a norm weight read into the wrong place shows;
    `biases`: every bias N(0, 0.5), where transformers starts them at 0), saved into
    `folder`; in eval mode."""
    torch.manual_seed(0)
    hf_model = model_cls(config)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if norms and name.endswith("norm.weight"):  # per head too (Command R+'s [H, D])
                param.uniform_(0.5, 1.5)
            elif param.dim() > 1:
                param.normal_(0.0, 0.2)
            elif norms:
                param.uniform_(0.5, 1.5)
        for name, param in hf_model.named_parameters():
            if biases and name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    hf_model.save_pretrained(folder)
    return hf_model.eval()


def saved_family(
    folder: Path, prefix: str, settings: dict[str, Any], *, norms: bool = True, biases: bool = False
) -> Any:
    """saved_random_model of transformers' `<prefix>ForCausalLM` over `<prefix>Config(**settings)`
    (e.g. prefix "Qwen3")."""
    import transformers

    config = getattr(transformers, f"{prefix}Config")(**settings)
    model_cls = getattr(transformers, f"{prefix}ForCausalLM")
    return saved_random_model(folder, model_cls, config, norms=norms, biases=biases)


def assert_greedy_matches(folder: Path, hf_model: Any, device: str = "cpu") -> None:
    """The runner on `folder` (fp32) answers transformers' greedy tokens for PROMPTS, in
    5-token prefill chunks; on CUDA with graphs for decode and mixed steps."""
    expected = [hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    runner = runner_for(folder) if device == "cpu" else _cuda_runner(folder)
    driver = PlanDriver(runner, chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token


def assert_edit_matters(
    folder: Path,
    hf_model: Any,
    out: Path,
    edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
    config: dict[str, Any] | None = None,
) -> None:
    """`folder`'s checkpoint with its tensors edited (and its config.json replaced, where
    given), saved in `out`, no longer answers transformers' greedy tokens: what the edit
    touched is read."""
    from safetensors.torch import load_file, save_file

    cfg = config or json.loads((folder / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(edit(load_file(folder / "model.safetensors")), out / "model.safetensors")
    with pytest.raises(AssertionError):
        assert_greedy_matches(out, hf_model)


def _cuda_runner(folder: Path) -> Any:
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions
    from troupe.gpu.weights import load_model

    config, model = load_model(folder, torch.float32, torch.device("cuda"), 256)
    options = RunnerOptions(
        block_size=4, num_gpu_blocks=64, max_model_len=256, max_num_seqs=4, mixed_graph_tokens=32
    )
    return ModelRunner(config, model, options)
