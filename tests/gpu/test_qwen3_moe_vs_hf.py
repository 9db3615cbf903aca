"""Qwen3-MoE (sparse and dense layers, top-k routing) is greedy token-identical to HF
transformers (fp32, CPU) through chunked prefill, the real scheduler and allocator with prefix
caching, and preemption by swap and by recompute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.weights import random_weights

TINY_MOE = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,  # the dense layer's MLP
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],  # layers 0 and 2 sparse, 1 dense
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
}
PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 12
_HF_TOKENS: dict[tuple[tuple[int, ...], int], list[int]] = {}


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """An HF folder written as checkpoints are (experts one by one) and transformers' model
    loaded from it (transformers 5 fuses the experts on load)."""
    import transformers
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("qwen3_moe")
    hf_config = transformers.Qwen3MoeConfig(**TINY_MOE)
    hf_config.save_pretrained(folder)
    config = ModelConfig.from_hf_folder(folder)
    save_file(random_weights(config, torch.float32, seed=3, std=0.2), folder / "model.safetensors")
    hf_model = transformers.Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return folder, hf_model.eval()


def test_config_reads_sparse_layers_and_names_bad_fields() -> None:
    base = {"model_type": "qwen3_moe", **TINY_MOE}
    moe = ModelConfig.from_hf_dict(base).moe
    assert moe is not None and moe.sparse_layers == (True, False, True)
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (8, 2, 32)
    step2 = ModelConfig.from_hf_dict({**base, "decoder_sparse_step": 2, "mlp_only_layers": []})
    assert step2.moe is not None and step2.moe.sparse_layers == (False, True, False)
    # transformers 5 writes num_local_experts
    renamed = {k: v for k, v in base.items() if k != "num_experts"} | {"num_local_experts": 8}
    assert ModelConfig.from_hf_dict(renamed).moe == moe
    assert ModelConfig.from_hf_dict({**base, "mlp_only_layers": [0, 1, 2]}).moe is None
    with pytest.raises(ModelLoadError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict({**base, "num_experts_per_tok": 9})
    with pytest.raises(ModelLoadError, match="decoder_sparse_step"):
        ModelConfig.from_hf_dict({**base, "decoder_sparse_step": 0})


def test_greedy_matches_hf_with_chunked_prefill(moe_model: tuple[Path, Any], mt: Any) -> None:
    folder, hf_model = moe_model
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    driver = mt.PlanDriver(mt.runner_for(folder), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token
    # the routing matters: every token to expert 0 alone gives other logits
    sparse = [hf_model.model.layers[0].mlp.gate, hf_model.model.layers[2].mlp.gate]
    saved = [gate.weight.clone() for gate in sparse]
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[0]])
        routed = hf_model(ids).logits[0, -1]
        for gate in sparse:
            gate.top_k = 1
            gate.weight.zero_()
        single = hf_model(ids).logits[0, -1]
        for gate, weight in zip(sparse, saved, strict=True):
            gate.top_k = 2
            gate.weight.copy_(weight)
        assert torch.equal(hf_model(ids).logits[0, -1], routed)
    assert (routed - single).abs().max() > 1e-2


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_scheduler_prefix_cache_and_preemption(
    mode: str, moe_model: tuple[Path, Any], mt: Any
) -> None:
    from troupe.actors.core.allocator import AllocatorCore
    from troupe.actors.core.scheduler import SchedulerCore
    from troupe.actors.core.step_limits import StepLimits
    from troupe.messages import AdmittedRequest, SamplingParams
    from troupe.ops.bench_scheduler import CoreLoop

    folder, hf_model = moe_model
    prompts = [*PROMPTS, [*PROMPTS[0][:8], 150, 151]]  # shares two blocks with the first
    num_gpu, num_cpu = 12, 32 if mode == "swap" else 0
    runner = mt.runner_for(folder, num_gpu_blocks=num_gpu, num_cpu_blocks=num_cpu)
    sizes = dict(block_size=4, num_gpu_blocks=num_gpu, num_cpu_blocks=num_cpu)
    scheduler = SchedulerCore(
        StepLimits(4, num_gpu, max_num_seqs=4, max_num_batched_tokens=16),
        num_cpu_blocks=num_cpu,
        preemption_mode=mode,
    )
    allocator = AllocatorCore(**sizes)
    loop = CoreLoop(scheduler, allocator, runner)
    num_new = 16
    requests = [
        AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(p),
            params=SamplingParams(max_tokens=num_new, temperature=0.0, ignore_eos=True),
            arrival_time=0.0,
            max_total_tokens=len(p) + num_new,
        )
        for i, p in enumerate(prompts)
    ]
    loop.submit(requests[:2])
    loop.run(inject={3: [requests[2]]})  # after r0's prompt is cached
    for i, p in enumerate(prompts):
        key = (tuple(p), num_new)
        if key not in _HF_TOKENS:  # both modes compare against the same continuations
            _HF_TOKENS[key] = mt.hf_greedy(hf_model, p, num_new)
        assert loop.tokens[f"r{i}"] == _HF_TOKENS[key], i
    stats = scheduler.stats()
    assert stats.num_preemptions_swap + stats.num_preemptions_recompute > 0
    assert allocator.prefix_cache_hit_tokens > 0
    assert loop.num_refused == 0 and allocator.gpu.num_free == num_gpu


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda_graphs"])
def test_cuda_kernels_match_hf(graphs: bool, moe_model: tuple[Path, Any], mt: Any) -> None:
    """The fused Triton MoE in the model on CUDA (fp32, CUDA graphs for decode and mixed
    steps, overlap) gives transformers' greedy tokens."""
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions
    from troupe.gpu.weights import load_model

    folder, hf_model = moe_model
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    config, model = load_model(folder, torch.float32, torch.device("cuda"), 256)
    options = RunnerOptions(
        block_size=4,
        num_gpu_blocks=64,
        max_model_len=256,
        max_num_seqs=4,
        enforce_eager=not graphs,
        overlap_schedule=graphs,
        mixed_graph_tokens=32 if graphs else 0,
    )
    driver = mt.PlanDriver(ModelRunner(config, model, options), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
