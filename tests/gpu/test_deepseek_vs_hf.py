"""DeepSeek-V2 (plain q_proj, softmax group-limited routing) and DeepSeek-V3 (q LoRA, sigmoid
routing with correction bias, an MTP layer to skip), both with YaRN rope, a dense first layer
and shared experts, are greedy token-identical to HF transformers (fp32, CPU) through chunked
prefill, the real scheduler and allocator with prefix caching, and preemption by swap and by
recompute. The KV pool holds one latent row (kv_lora_rank + rope dim) per token."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.pool_sizing import block_bytes
from troupe.gpu.weights import random_weights

COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 96,  # the dense first layer
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 1.5,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
    # a short original context so YaRN's blend and its attention factor matter here
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "mscale": 1.0,
        "mscale_all_dim": 0.8,
        "beta_fast": 32,
        "beta_slow": 1,
    },
}
VARIANTS = {
    "v2": ("DeepseekV2", {"q_lora_rank": None, "topk_method": "group_limited_greedy"}),
    "v3": (
        "DeepseekV3",
        {"q_lora_rank": 24, "norm_topk_prob": True, "num_nextn_predict_layers": 1},
    ),
}
PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8, 64, 12, 31], [200, 1, 77, 13, 90, 4, 4, 4, 18]]
NUM_NEW = 12
_HF_TOKENS: dict[tuple[str, tuple[int, ...], int], list[int]] = {}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def deepseek(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(variant, HF folder, transformers' model loaded from it); V3's folder also holds an MTP
    layer's tensor, which the engine must skip."""
    import transformers
    from safetensors.torch import save_file

    variant: str = request.param
    prefix, extra = VARIANTS[variant]
    folder = tmp_path_factory.mktemp(f"deepseek_{variant}")
    hf_config = getattr(transformers, f"{prefix}Config")(**COMMON, **extra)
    hf_config.save_pretrained(folder)
    config = ModelConfig.from_hf_folder(folder)
    weights = random_weights(config, torch.float32, seed=3, std=0.2)
    if variant == "v3":
        weights["model.layers.2.eh_proj.weight"] = torch.zeros(4, 4)  # the MTP layer
    save_file(weights, folder / "model.safetensors")
    hf_model = getattr(transformers, f"{prefix}ForCausalLM").from_pretrained(
        folder, dtype=torch.float32
    )
    return variant, folder, hf_model.eval()


def test_config_and_latent_pool_size() -> None:
    cfg = {"model_type": "deepseek_v3", **COMMON, **VARIANTS["v3"][1]}
    config = ModelConfig.from_hf_dict(cfg)
    assert config.mla is not None and config.moe is not None
    assert config.moe.sparse_layers == (False, True)
    assert config.num_mtp_layers == 1 and config.mla.rope_interleave
    # one plane of kv_lora_rank + rope values per token and layer: no per-head K and V
    assert config.kv_values_per_token == 32 + 8
    assert block_bytes(config, 16, torch.bfloat16) == 2 * 16 * 40 * 2
    v2 = ModelConfig.from_hf_dict({"model_type": "deepseek_v2", **COMMON, **VARIANTS["v2"][1]})
    assert v2.mla is not None and v2.mla.q_lora_rank == 0 and v2.mla.rope_interleave
    with pytest.raises(ModelLoadError, match="attention_bias"):
        ModelConfig.from_hf_dict({**cfg, "attention_bias": True})
    with pytest.raises(ModelLoadError, match="n_group"):
        ModelConfig.from_hf_dict({**cfg, "n_group": 3})
    with pytest.raises(ConfigError, match="mla_expand_min_tokens must be an integer >= 0"):
        EngineConfig(mla_expand_min_tokens=-1)
    with pytest.raises(ConfigError, match="mla_expand_max_tokens must be an integer >= 0"):
        EngineConfig(mla_expand_max_tokens=1.5)  # type: ignore[arg-type]


def test_greedy_matches_hf_with_chunked_prefill(deepseek: Any, mt: Any) -> None:
    _, folder, hf_model = deepseek
    expected = [mt.hf_greedy(hf_model, p, NUM_NEW) for p in PROMPTS]
    runner = mt.runner_for(folder)
    assert runner.kv.gpu.shape[1:] == (1, 64, 4, 1, 40)  # planes, blocks, block size, 1, L + R
    driver = mt.PlanDriver(runner, chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected
    assert len(set(expected[0])) > 2  # the model is not stuck on one token


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_scheduler_prefix_cache_and_preemption(deepseek: Any, mode: str, mt: Any) -> None:
    from troupe.actors.core.allocator import AllocatorCore
    from troupe.actors.core.scheduler import SchedulerCore
    from troupe.actors.core.step_limits import StepLimits
    from troupe.messages import AdmittedRequest, SamplingParams
    from troupe.ops.bench_scheduler import CoreLoop

    variant, folder, hf_model = deepseek
    prompts = [*PROMPTS, [*PROMPTS[0][:8], 150, 151]]  # shares two blocks with the first
    num_gpu, num_cpu = 12, 32 if mode == "swap" else 0
    # swap also splits each step with a chunk of >= 2 tokens: decodes absorbed, prefills
    # expanded through ops.mla_prefill (gpu/mla_layer.py); recompute keeps steps whole
    expand = 2 if mode == "swap" else 0
    runner = mt.runner_for(
        folder, num_gpu_blocks=num_gpu, num_cpu_blocks=num_cpu, mla_expand_min_tokens=expand
    )
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
        key = (variant, tuple(p), num_new)
        if key not in _HF_TOKENS:  # both modes compare against the same continuations
            _HF_TOKENS[key] = mt.hf_greedy(hf_model, p, num_new)
        assert loop.tokens[f"r{i}"] == _HF_TOKENS[key], i
    stats = scheduler.stats()
    assert stats.num_preemptions_swap + stats.num_preemptions_recompute > 0
    assert allocator.prefix_cache_hit_tokens > 0
    assert loop.num_refused == 0 and allocator.gpu.num_free == num_gpu


@pytest.mark.parametrize("deepseek", ["v3"], indirect=True)  # one variant: interpreter time
def test_triton_ops_match_hf(deepseek: Any, mt: Any) -> None:
    """The model on the Triton ops (the CUDA path: absorbed MLA kernel for decode rows and short
    chunks, the expanded prefill for chunks of >= 4 tokens, latent write, fused MoE), on the
    CPU under TRITON_INTERPRET=1 when there is no GPU."""
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions
    from troupe.gpu.weights import load_model

    _, folder, hf_model = deepseek
    num_new = 6
    expected = [mt.hf_greedy(hf_model, p, num_new) for p in PROMPTS]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config, model = load_model(folder, torch.float32, device, 256, "triton")
    options = RunnerOptions(
        block_size=4, num_gpu_blocks=64, max_model_len=256, max_num_seqs=4, mla_expand_min_tokens=4
    )
    driver = mt.PlanDriver(ModelRunner(config, model, options), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(num_new)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("graphs", "expand"), [(False, 0), (True, 0), (True, 4)], ids=["eager", "graphs", "expanded"]
)
def test_cuda_kernels_match_hf(deepseek: Any, graphs: bool, expand: int, mt: Any) -> None:
    """The Triton MLA kernels (absorbed for decode and prefill rows; with `expand`, chunks of
    >= 4 tokens in the expanded form, eagerly, beside graphs for the rest) and fused MoE in
    the model on CUDA (fp32, CUDA graphs for decode and mixed steps, overlap) give
    transformers' tokens."""
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions
    from troupe.gpu.weights import load_model

    _, folder, hf_model = deepseek
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
        mla_expand_min_tokens=expand,
    )
    driver = mt.PlanDriver(ModelRunner(config, model, options), chunk=5)
    for i, prompt in enumerate(PROMPTS):
        driver.add(f"r{i}", prompt)
    driver.run(NUM_NEW)
    assert [driver.seqs[f"r{i}"].output for i in range(len(PROMPTS))] == expected


def _step_meta(seq_lens: list[int], q_lens: list[int], split: bool, device: torch.device) -> Any:
    """Metadata of one step over sequences in blocks s * 16 ... (block size 4); with `split`,
    the expanded form for the sequences after the leading one-token decodes."""
    from troupe.gpu.attention import AttentionMetadata, ExpandedPrefill

    slots, positions = [], []
    for s, (n, q) in enumerate(zip(seq_lens, q_lens, strict=True)):
        positions += list(range(n - q, n))
        slots += [(s * 16 + p // 4) * 4 + p % 4 for p in range(n - q, n)]
    first = next(i for i, q in enumerate(q_lens) if q > 1)
    ends = torch.tensor(q_lens).cumsum(0)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device),
        block_tables=torch.arange(len(seq_lens) * 16, dtype=torch.int32, device=device).view(
            -1, 16
        ),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, *ends.tolist()], dtype=torch.int32, device=device),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        is_decode=False,
        logits_indices=(ends - 1).to(device),
        expanded_prefill=ExpandedPrefill(
            first_prefill=first,
            max_seq_len=max(seq_lens[first:]),
            blocks=torch.tensor(
                [s * 16 + b for s in range(first, len(seq_lens)) for b in range(16)], device=device
            ),
            tables=torch.arange(
                (len(seq_lens) - first) * 16, dtype=torch.int32, device=device
            ).view(-1, 16),
        )
        if split
        else None,
    )
    return meta, torch.tensor(positions, device=device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_expanded_and_absorbed_steps_agree_bf16_on_cuda(deepseek: Any) -> None:
    """The model in bf16 on CUDA: a mixed step (a decode, then a chunk after cached context,
    then a whole prompt) with its prefills expanded gives the logits of the all-absorbed step."""
    from troupe.gpu.kv_cache import KVCache
    from troupe.gpu.weights import load_model

    _, folder, _ = deepseek
    device = torch.device("cuda")
    config, model = load_model(folder, torch.bfloat16, device, 256)
    kv = KVCache(config, num_gpu_blocks=64, num_cpu_blocks=0, block_size=4,
                 dtype=torch.bfloat16, device=device)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        # fill the cache: 30 and 20 tokens of the first two sequences
        meta, pos = _step_meta([30, 20, 2], [30, 20, 2], split=False, device=device)
        ids = torch.randint(0, config.vocab_size, (52,), generator=gen).to(device)
        model(ids, pos, meta, kv.layers)
        ids = torch.randint(0, config.vocab_size, (1 + 25 + 40,), generator=gen).to(device)
        logits = []
        for split in (False, True):
            meta, pos = _step_meta([31, 45, 40], [1, 25, 40], split=split, device=device)
            logits.append(model.compute_logits(model(ids, pos, meta, kv.layers)).float())
    absorbed, expanded = logits
    # bf16 through two orders of summation (H200, 2026-12-02: 0.0217); a wrong form is O(1)
    assert float((expanded - absorbed).norm() / absorbed.norm()) < 4e-2
    assert torch.equal(expanded.argmax(-1), absorbed.argmax(-1))


def test_expanded_prefill_lists_exactly_the_prefill_blocks() -> None:
    """Two leading decodes, then chunks of 6 and 9 tokens: the split starts at the third
    sequence and lists only the blocks the prefill sequences hold, in order; the policy
    refuses short chunks and more than max_tokens tokens to expand."""
    import numpy as np
    from troupe.gpu.device_inputs import ExpandPolicy, expanded_prefill
    from troupe.gpu.step_inputs import StepInputs

    lens = np.array([7, 30, 10, 9], dtype=np.int32)
    q_lens = np.array([1, 1, 6, 9])
    tables = np.array([[1, 2, 0], [3, 4, 5], [9, 8, 7], [6, 11, 12]], dtype=np.int32)
    inputs = StepInputs(
        input_ids=np.zeros(17, np.int64), positions=np.zeros(17, np.int64),
        slot_mapping=np.zeros(17, np.int64), block_tables=tables, seq_lens=lens,
        query_start_loc=np.concatenate([[0], q_lens.cumsum()]).astype(np.int32),
        logits_indices=np.zeros(4, np.int64), sampled_rows=np.arange(4), max_query_len=9,
        max_seq_len=30, num_decode_prefix=2,
    )  # fmt: skip
    cpu = torch.device("cpu")
    assert expanded_prefill(inputs, ExpandPolicy(10, 100), 4, cpu) is None  # chunks up to 9
    assert expanded_prefill(inputs, ExpandPolicy(0, 100), 4, cpu) is None
    assert expanded_prefill(inputs, ExpandPolicy(9, 23), 4, cpu) is None  # 6 blocks: 24 tokens
    split = expanded_prefill(inputs, ExpandPolicy(9, 24), 4, cpu)
    assert split is not None and (split.first_prefill, split.max_seq_len) == (2, 10)
    assert split.blocks.tolist() == [9, 8, 7, 6, 11, 12]
    assert split.tables.tolist() == [[0, 1, 2], [3, 4, 5]]
    lens[3] = 5  # two blocks: the table row pads with 0
    split = expanded_prefill(inputs, ExpandPolicy(9, 24), 4, cpu)
    assert split is not None and split.blocks.tolist() == [9, 8, 7, 6, 11]
    assert split.tables.tolist() == [[0, 1, 2], [3, 4, 0]]
