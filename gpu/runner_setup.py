"""From an EngineConfig to what a ModelRunner is built from: the device and dtype resolved,
the model (and a draft model) loaded, the KV pools sized (gpu/pool_sizing.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from troupe.config import ConfigError, EngineConfig, LogprobsMode, resolve_model_path
from troupe.gpu.activation_profile import profile_activation_peak
from troupe.gpu.cpu_q4lib import Q4Options
from troupe.gpu.draft_model import DraftModel, load_draft
from troupe.gpu.eagle_load import EagleModel, load_eagle
from troupe.gpu.heap_trim import release_freed_heap
from troupe.gpu.kv_cache import kv_dtype
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel
from troupe.gpu.mtp_load import load_mtp
from troupe.gpu.pool_sizing import blocks_from_free_memory, cpu_device_blocks, swap_pool_blocks
from troupe.gpu.weights import load_model, read_config
from troupe.spec_cost import batch_limit

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerOptions:
    """The engine settings the runner needs, resolved (no 'auto', no None pools)."""

    block_size: int = 16
    num_gpu_blocks: int
    num_cpu_blocks: int = 0
    max_num_seqs: int = 256
    max_model_len: int
    seed: int = 0
    enforce_eager: bool = True
    # steps with prefill chunks replay CUDA graphs too (gpu/mixed_graphs.py), up to this many
    # tokens; 0: they run eagerly
    mixed_graph_tokens: int = 0
    overlap_schedule: bool = False  # launch each decode step before its plan (gpu/overlap.py)
    num_speculative_tokens: int = 0  # proposals per sequence a step may verify
    kv_cache_dtype: str = "auto"  # "fp8": e4m3 blocks with per layer and KV head scales
    # a draft model's round reads at most this many tokens (its catch-up: gpu/draft_runner.py)
    max_num_batched_tokens: int = 4096
    spec_disable_batch_size: int | None = None  # no draft round in steps sampling this many
    # MLA models: steps with a prefill chunk of this many tokens expand it, when the prefill
    # sequences hold at most mla_expand_max_tokens tokens (gpu/forward_pass.py)
    mla_expand_min_tokens: int = 128
    mla_expand_max_tokens: int = 32768
    spec_backoff_steps: int = 16  # rounds a draft skips a request whose proposals went unused
    # StreamingLLM requests may run this many positions (0: no streaming attention here)
    max_stream_len: int = 0
    logprobs_mode: LogprobsMode = "raw_logprobs"  # what sampled tokens' logprobs hold
    prompt_embeds: bool = False  # steps may carry input embeddings (gpu/embed_rows.py)


@dataclasses.dataclass(frozen=True)
class LoadedRunner:
    """The arguments of ModelRunner(...) for one EngineConfig."""

    config: ModelConfig
    model: DecoderModel
    options: RunnerOptions
    draft: DraftModel | EagleModel | None = None


def model_dtype(config: EngineConfig, device: torch.device) -> torch.dtype:
    """The weights' dtype: config.dtype, or bf16 on CUDA and fp32 on the CPU for "auto"."""
    if config.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[config.dtype]


def checked_max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
    """config.max_model_len (the model's max_position_embeddings when unset); past the model's
    limit: ConfigError. A yarn scaling (e.g. hf_overrides' for Qwen3) lifts the limit to its
    original_max_position_embeddings x factor where that is longer, as vLLM derives it."""
    declared = model_config.max_position_embeddings
    limit, scaling = declared, model_config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "yarn":
        limit = max(limit, int(scaling["original_max_position_embeddings"] * scaling["factor"]))
    max_model_len = config.max_model_len or declared
    if max_model_len > limit:
        scaled = "" if limit == declared else f" (yarn's {limit})"
        raise ConfigError(
            f"max_model_len {max_model_len} exceeds the model's "
            f"max_position_embeddings {declared}{scaled}"
        )
    return max_model_len


def max_stream_len(config: EngineConfig, device: torch.device, model: ModelConfig) -> int:
    """How long a StreamingLLM request may run: config.streaming_max_len where the attention
    has the sink clause (the CPU: kernels/streaming_attention.py; the Triton kernels, the
    CUDA graphs and the overlapped decode do not have it yet) and the model attends as it
    expects (no sliding window, MLA or learned sinks, no draft model to keep in step, one
    rank); else 0."""
    plain = not (
        model.layer_windows
        or model.mla
        or model.is_gemma
        or model.attention_sinks
        or model.scales_queries  # Ministral 3's, by their position (not the cache's); HunYuan's
        or model.layer_norm  # Cohere's parallel block: gpu/streaming_reference.py is Llama's
    )
    single = not config.executor_proposes and config.tensor_parallel_size == 1
    return config.streaming_max_len if device.type == "cpu" and plain and single else 0


def runner_options(
    config: EngineConfig,
    device: torch.device,
    *,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    max_model_len: int,
    stream_len: int = 0,
) -> RunnerOptions:
    """RunnerOptions from the config and the numbers resolved for this device."""
    return RunnerOptions(
        block_size=config.block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_num_seqs=config.max_num_seqs,
        max_model_len=max_model_len,
        seed=config.seed,
        # the reference ops sync with the host (tolist): no CUDA graphs for them
        enforce_eager=config.enforce_eager or config.kernel_backend == "torch",
        mixed_graph_tokens=min(config.max_mixed_graph_tokens, config.step_budget()),
        # a CPU step runs synchronously: launching the next one early overlaps nothing
        overlap_schedule=config.enable_overlap_schedule and device.type == "cuda",
        num_speculative_tokens=config.num_proposals,
        kv_cache_dtype=config.kv_cache_dtype,
        max_num_batched_tokens=config.step_budget(),
        spec_disable_batch_size=batch_limit(config),
        spec_backoff_steps=config.speculative_backoff_steps,
        mla_expand_min_tokens=config.mla_expand_min_tokens,
        mla_expand_max_tokens=config.mla_expand_max_tokens,
        max_stream_len=stream_len,
        logprobs_mode=config.logprobs_mode,
        prompt_embeds=config.enable_prompt_embeds,
    )


def uses_cuda(config: EngineConfig) -> bool:
    """Whether the config's runner runs on CUDA ("auto": when torch sees a device)."""
    return config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())


def is_large_gpu(config: EngineConfig) -> bool:
    """Whether the model runs on a CUDA device of >= 70 GiB that is not an A100: where vLLM
    doubles its server's step budget (an A100 measured slower with it)."""
    if config.runner != "model" or not uses_cuda(config) or not torch.cuda.is_available():
        return False
    index = config.prefill_device_index if config.disaggregation != "none" else None
    props = torch.cuda.get_device_properties(index)
    return props.total_memory >= 70 * 2**30 and "A100" not in props.name


def with_step_budget(config: EngineConfig) -> EngineConfig:
    """`config` with max_num_batched_tokens resolved for the device it runs on."""
    return config.replace(max_num_batched_tokens=config.step_budget(is_large_gpu(config)))


def load_for_config(config: EngineConfig) -> LoadedRunner:
    """Load config.model (default GGUF when None) and size the pools from the config."""
    path = resolve_model_path(config.model)
    device = torch.device("cuda" if uses_cuda(config) else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device is 'cuda' but torch sees no CUDA device")
    dtype = model_dtype(config, device)
    declared = read_config(Path(path), config.hf_overrides)
    max_model_len = checked_max_model_len(config, declared)
    stream_len = max_stream_len(config, device, declared)
    model_config, model = load_model(  # the rotary table spans what streaming requests reach
        Path(path),
        dtype,
        device,
        max(max_model_len, stream_len),
        config.kernel_backend,
        config.quantization,
        Q4Options.from_config(config),
        config.hf_overrides,
    )
    if config.limit_images_per_prompt and model_config.text_of is not None:
        from troupe.gpu.vision_load import load_vision

        model.vision = load_vision(Path(path), dtype, device)
    if device.type == "cpu":  # the load's temporaries: back to the OS (peak RSS)
        release_freed_heap()
    if config.lora_modules or config.enable_lora:  # before the memory profile: slots count
        from troupe.gpu.lora_runtime import install_lora

        most = config.step_budget(is_large_gpu(config))
        most += config.max_num_seqs * (1 + config.num_proposals)  # merged, verified steps
        install_lora(
            model,
            model_config,
            config.lora_adapters,
            max_loras=config.max_loras,
            max_rank=config.max_lora_rank,
            max_tokens=most,
            wrap_all=config.enable_lora,
            kernel=config.lora_kernel,
        )
    cache_dtype = kv_dtype(config.kv_cache_dtype, dtype)  # what the pools are sized in
    draft: DraftModel | EagleModel | None = None
    if config.speculative_method == "draft_model":
        draft = load_draft(config, model_config, dtype, device, max_model_len)
    elif config.executor_proposes:  # a head, before sizing: its buffer of hidden states
        most = config.step_budget(is_large_gpu(config)) + config.max_num_seqs * (
            1 + config.num_proposals
        )
        if config.speculative_method == "mtp":  # the model's own MTP layer (gpu/mtp_load.py)
            draft = load_mtp(Path(path), model_config, model, most)
        else:
            draft = load_eagle(config, model_config, model, max_model_len, most)
    num_gpu_blocks = config.num_kv_blocks
    if num_gpu_blocks is None and device.type == "cuda":
        peak = profile_activation_peak(model, config, max_model_len)
        num_gpu_blocks = blocks_from_free_memory(
            model_config,
            config.block_size,
            cache_dtype,
            device,
            config.gpu_memory_utilization,
            peak,
            extra_block_bytes=draft.block_bytes(config.block_size, cache_dtype) if draft else 0,
        )
    elif num_gpu_blocks is None:
        num_gpu_blocks = cpu_device_blocks(
            model_config, config, cache_dtype, max_model_len=max_model_len
        )
    num_cpu_blocks = config.num_cpu_blocks
    if num_cpu_blocks is None:
        num_cpu_blocks = swap_pool_blocks(
            model_config, config, cache_dtype, device, num_gpu_blocks=num_gpu_blocks
        )
    options = runner_options(
        config,
        device,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_model_len=max_model_len,
        stream_len=stream_len,
    )
    if model.vision is not None:  # image rows ride the input-embedding path (embed_rows.py)
        options = dataclasses.replace(options, prompt_embeds=True)
    return LoadedRunner(model_config, model, options, draft)
