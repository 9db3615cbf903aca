"""EngineConfig: every knob of the engine, checked once, in one place."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from troupe.config_checks import ConfigError as ConfigError  # its home; imported from here
from troupe.config_checks import (
    check_chat_template,
    check_disaggregation,
    check_generation_config,
    check_lora,
    check_prompt_embeds,
    check_speculative,
    template_defaults_json,
)
from troupe.config_checks import check_positive as _positive
from troupe.config_pipeline import check_pipeline
from troupe.kernels.ops import KernelBackend

# the default model and where a model's path is resolved: their home is model_path.py
from troupe.model_path import DEFAULT_MODEL_NAME as DEFAULT_MODEL_NAME
from troupe.model_path import DEFAULT_MODEL_PACKAGE as DEFAULT_MODEL_PACKAGE
from troupe.model_path import default_model_path as default_model_path
from troupe.model_path import resolve_model_path as resolve_model_path
from troupe.policies.preemption import PREEMPTION_POLICIES
from troupe.policies.queue import QUEUE_POLICIES

# Fields named by a registry key (policies/): a new policy needs no edit here (field_choices).
NAMED_BY_REGISTRY: dict[str, Mapping[str, object]] = {
    "preemption_mode": PREEMPTION_POLICIES,
    "scheduling_policy": QUEUE_POLICIES,
}

# "auto": quantized weights stay as shipped (GGUF, fp8, GPTQ/AWQ) and are dequantized in the
# matmul (gpu/quant_linear.py); "dequantize": expand them to `dtype` at load.
Quantization = Literal["auto", "keep", "dequantize"]  # gpu/weights.load_model
# "ngram": actors/core/ngram_proposer.py; "draft_model": gpu/draft_runner.py; "eagle*", "mtp":
# eagle_runner ("deepseek_mtp", vLLM's older name, is taken as "mtp": config_checks.py)
SpeculativeMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp", "deepseek_mtp"]
Disaggregation = Literal["none", "prefill_decode"]  # actors/core/phase_router.py
LoraKernel = Literal["masked", "punica"]  # how a step's adapters run: gpu/lora_linear.py
LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Engine settings. CLI flags mirror these names in kebab-case."""

    model: str | None = None  # HF folder, .gguf file, or None for the default model
    # config.json keys replaced before it is read (vLLM's --hf-overrides; e.g. rope_scaling for
    # YaRN); HF folders only (gpu/hf_overrides.py)
    hf_overrides: dict[str, Any] | None = None
    # The chat template to use instead of the model's (vLLM's --chat-template): a .jinja file's
    # path or the template's text; None: the model's own (actors/core/tokenizer_files.py)
    chat_template: str | None = None
    default_chat_template_kwargs: dict[str, Any] | None = None  # vLLM's; a request's win
    # The sampling defaults of requests that leave a field unset (vLLM's --generation-config):
    # "auto" the model's generation_config.json (a GGUF's general.sampling.* keys), "vllm"
    # none, or a folder with a generation_config.json; override_generation_config's keys
    # (e.g. {"temperature": 0.5}) on top. actors/generation_defaults.py
    generation_config: str = "auto"
    override_generation_config: dict[str, float | int] | None = None
    runner: Literal["model", "fake"] = "model"  # "fake": deterministic fake model (tests, benches)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # "fp8": e4m3 KV blocks, scales per layer and KV head set from the first write
    # (kernels/kv_quant.py); half the bytes of bf16, so twice the blocks in the same memory
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # GGUF (and HF fp8, GPTQ, AWQ) weights: "auto" keeps them as shipped, expanded in the matmul
    # (gpu/quant_linear.py); "dequantize" expands them to `dtype` at load (in fp32 on the CPU:
    # token-identical to transformers). "auto" is the default: on the CPU it loads faster,
    # decodes ~2x faster and prefills faster than "dequantize" (docs/benchmarks.md, issue 16).
    quantization: Quantization = "auto"
    # CPU 4-bit and Q8_0 weights (kept as shipped): native kernels (gpu/cpu_q4dot.c, built with
    # gcc on first use into cpu_kernel_cache_dir, None: ~/.cache/troupe/cpu_kernels) with 8-bit
    # activations and integer dot products (AVX-512 VNNI, else AVX2), split over
    # cpu_kernel_threads threads of torch's OpenMP pool (0: torch's intra-op count at load; a
    # decode step's one-row calls take 1 or all, whichever its first steps time faster). False,
    # or a CPU or machine without them: torch's int4 kernel and fbgemm's int8 one (issue 16).
    cpu_native_kernels: bool = True
    cpu_kernel_cache_dir: str | None = None
    cpu_kernel_threads: int = 0
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: size the GPU pool from free memory
    num_cpu_blocks: int | None = None  # swap pool; None: cpu_swap_gib worth of blocks
    cpu_swap_gib: float = 2.0
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    # Parallel sampling: the most samples a request may ask for (n, best_of), at most max_num_seqs
    max_num_samples: int = 16
    # The most tokens one step computes, prompt chunks and decodes together. None: 8192 on a
    # CUDA device of 70 GiB or more other than an A100 (vLLM's server default on such GPUs;
    # on the H200 it measured as 4096 does, docs/benchmarks.md), else 4096. Resolved once at
    # start (step_budget).
    max_num_batched_tokens: int | None = None
    # The most prompt tokens one request computes per step (0: no cap but the step's budget).
    # Smaller chunks keep the decodes sharing their steps fast (ITL), at a few steps more to the
    # first token. vLLM's name for the same knob.
    long_prefill_token_threshold: int = 0
    max_model_len: int | None = None  # None: the model's own limit
    # StreamingLLM (attention sinks): a request with a window keeps the KV of its first
    # `sink_tokens` tokens and of its last `streaming_window` ones and frees the blocks between,
    # so it runs past max_model_len in bounded memory, up to streaming_max_len tokens
    # (docs/architecture.md). Defaults for requests that do not say (SamplingParams fields of
    # the same names); streaming_window 0: off. CPU path, models without a sliding window.
    streaming_window: int = 0
    sink_tokens: int = 4
    streaming_max_len: int = 32768
    enable_prefix_caching: bool = True
    # Cached GPU blocks that are evicted move to the CPU pool (num_cpu_blocks, shared with
    # swapping) and come back on a prefix hit instead of being recomputed (prefix_tier.py).
    prefix_cache_cpu_tier: bool = False
    preemption_mode: str = "auto"  # auto, swap, recompute: policies/preemption.py
    scheduling_policy: str = "priority"  # priority, fcfs: policies/queue.py
    max_queued_requests: int = 4096
    max_queued_tokens: int = 4_000_000
    max_stream_buffer: int = 4096  # events a slow reader may fall behind before it is cut off
    logprobs_mode: LogprobsMode = "raw_logprobs"  # vLLM's: what logprobs hold (gpu/sampler.py)
    trace_path: str | None = None
    seed: int = 0
    enforce_eager: bool = False  # no CUDA graphs
    # Steps with prefill chunks replay CUDA graphs too (gpu/mixed_graphs.py), one per token bucket
    # up to min(this, max_num_batched_tokens); bigger ones run eagerly. 0: decode steps only.
    max_mixed_graph_tokens: int = 8192
    # MLA models (DeepSeek): a step whose longest prefill chunk has at least this many tokens
    # runs eagerly, its prefills with the latent expanded to per-head K/V (compute-bound; the
    # absorbed decode form spends ~3x the FLOPs there). 0: always the absorbed form.
    mla_expand_min_tokens: int = 128
    # ... when the step's prefill sequences hold at most this many tokens: the expansion makes
    # per-head K/V of all of them, one layer at a time (~21 KB per token at DeepSeek-V2-Lite
    # shape); longer contexts stay absorbed. The start-up memory profile expands this many.
    mla_expand_max_tokens: int = 32768
    # Launch each decode step before its plan arrives, so the device computes while the actors
    # plan (gpu/overlap.py). CUDA only: a CPU step runs synchronously, nothing to overlap.
    enable_overlap_schedule: bool = True
    # Model ops: "auto" is Triton on CUDA and torch on the CPU; "triton" on the CPU needs
    # TRITON_INTERPRET=1 (tests); "torch" on CUDA is for debugging (no CUDA graphs).
    kernel_backend: KernelBackend = "auto"
    # One executor step running longer than this stops the engine (watchdog): open requests
    # fail, /health turns 503 and `troupe serve` exits non-zero. None: no watchdog.
    step_timeout_s: float | None = 300.0
    # `troupe serve`'s engine process whose server is gone stops within this (os._exit past it)
    orphan_stop_timeout_s: float = 20.0
    # Speculative decoding (vLLM's names). "ngram": prompt lookup, proposals from each
    # request's own prompt and output (actors/core/ngram_proposer.py); "draft_model": a smaller
    # model of the same vocabulary (`draft_model`: HF folder or .gguf) that the executor runs
    # beside the target (gpu/draft_runner.py); "eagle": an EAGLE-1 or EAGLE-3 head (as its HF
    # folder says), "eagle3": an EAGLE-3 head, fed the target's hidden states; "mtp": the
    # model's own multi-token-prediction layer (DeepSeek-V3, gpu/mtp_load.py). The target
    # verifies num_speculative_tokens proposals in one step.
    speculative_method: SpeculativeMethod | None = None
    num_speculative_tokens: int | None = None  # None: a speculators-format head's count, else 4
    prompt_lookup_min: int = 2  # shortest n-gram (suffix of the sequence) that may match
    prompt_lookup_max: int = 4  # longest; the longest matching one proposes
    draft_model: str | None = None  # "draft_model": its HF folder or .gguf; "eagle": the head's
    # Per step: no proposals in a step with at least this many running requests (verifying
    # k+1 tokens each costs more than it saves once the batch is compute-bound). None: never.
    speculative_disable_by_batch_size: int | None = 32
    # Per request: a request whose acceptance rate (accepted / proposed, over its last
    # proposals) falls below this stops proposing for speculative_backoff_steps steps.
    speculative_min_acceptance: float = 0.2
    speculative_backoff_steps: int = 16
    # The cost model that turns proposals off where they cost more than they save (spec_cost.py):
    # a step's fixed cost in tokens, the extra cost of a verification step (and of a draft
    # model's round) in decode steps. False: propose in every step the limits allow (tests).
    speculative_cost_model: bool = True
    speculative_step_fixed_tokens: int = 128
    speculative_verify_overhead: float = 0.4
    speculative_draft_overhead: float = 1.3
    # Structured output: the longest a grammar may take to compile (a request past it is
    # rejected naming its field), and the threads that fill token masks (actors/core/grammar.py).
    grammar_compile_timeout_s: float = 10.0
    grammar_threads: int = 4
    # Where the grammar actor's matchers run (actors/grammar_process.py): "process", a child with
    # an interpreter of its own (xgrammar's calls never wait for the engine's lock); "thread",
    # the actor's thread; "auto": a process on CUDA, a thread on the CPU (nothing to start).
    grammar_worker: Literal["auto", "thread", "process"] = "auto"
    # Draw a masked step when its kept forward's masks come before its plan (gpu/forward_ahead.py;
    # CUDA with overlap). Off: on the H200 they come with the plan (docs/benchmarks.md, s. 25).
    draw_masked_ahead: bool = False
    # The interpreter's thread switch interval while an engine runs (sys.setswitchinterval;
    # actors/switch_interval.py). A worker thread (the executor after a GPU sync, the grammar
    # after a mask fill) that gave up the interpreter lock waits up to this long to take it
    # back while the event loop runs the scheduler: CPython's 5 ms default sat on every
    # step's critical path. None: leave the interpreter's setting alone.
    gil_switch_interval_s: float | None = 0.0005
    # Freeze the garbage collector's view of the heap once the engine is ready (gc.freeze;
    # actors/heap_freeze.py): a full collection otherwise walks every start-up object, ~100 ms
    # with every request waiting. Process-wide: an embedding app's objects of that moment are
    # frozen too (unfrozen when the last engine closes).
    gc_freeze: bool = True
    # Megatron-style tensor parallelism, a worker process (a GPU on CUDA) per rank: tp_runner.py;
    # what it must divide: gpu/tp_model.py. Expert parallel: whole MoE experts per rank, not cut
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    # Pipeline parallelism, a worker process (a GPU on CUDA) per stage of layers: pp_runner.py.
    # Layers per stage "3,5" (vLLM's VLLM_PP_LAYER_PARTITION); None: vLLM's even split
    pipeline_parallel_size: int = 1
    pipeline_layer_partition: str | None = None
    # Prefill/decode disaggregation: "prefill_decode" computes prompts on one executor and their
    # continuations on another, each with its own worker process, model and KV pool; KV blocks
    # move between them through torch.distributed (gloo on the CPU, NCCL on CUDA). On CUDA the
    # two sides run on these device indices. What it does not combine with is refused here
    # (config_checks.check_disaggregation; docs/architecture.md).
    disaggregation: Disaggregation = "none"
    prefill_device_index: int = 0
    decode_device_index: int = 1
    # LoRA adapters (vLLM's --lora-modules): "name=path" entries, each a PEFT adapter folder
    # (adapter_config.json + adapter_model.safetensors); a request names one in
    # SamplingParams.lora (over HTTP: its `model`). Up to max_loras adapters run in one step,
    # each of rank <= max_lora_rank (gpu/lora_linear.py). Empty: no LoRA.
    lora_modules: tuple[str, ...] = ()
    # Adapters loaded and unloaded while the engine runs (engine.loras; HTTP with the gateway's
    # allow_runtime_lora_updating): every projection is wrapped, as no adapter says which yet
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    # "masked": every token through all max_loras slots, masked; "punica": each token through
    # its own adapter only (kernels/lora_shrink.py, lora_expand.py)
    lora_kernel: LoraKernel = "masked"
    # vLLM's --enable-sleep-mode: Engine.sleep / wake_up (and POST /sleep, /wake_up, GET
    # /is_sleeping) give the weights' and KV cache's device memory back and take it again
    enable_sleep_mode: bool = False
    # vLLM's --enable-prompt-embeds: a request may give input embeddings instead of a prompt
    # (messages/prompt_embeds.py); off, such a request is refused naming this flag
    enable_prompt_embeds: bool = False
    # images a prompt may carry (vLLM's --limit-mm-per-prompt's "image"), for a checkpoint
    # with a vision encoder (messages/images.py); 0: images refused. And the largest image,
    # width x height, the tokenizer decodes (a guard against decompression bombs)
    limit_images_per_prompt: int = 8
    max_image_pixels: int = 40_000_000
    # where Engine.start_profile / stop_profile (POST /start_profile, /stop_profile) write the
    # torch profiler's traces of the executor's steps; None: profiling is off
    profiler_dir: str | None = None
    log_format: Literal["console", "json"] = "console"
    log_level: str = "info"

    def __post_init__(self) -> None:
        _positive(
            self,
            "block_size",
            "max_num_seqs",
            "max_num_samples",
            "max_queued_requests",
            "max_queued_tokens",
            "max_stream_buffer",
        )
        check_chat_template(self)
        if self.block_size & (self.block_size - 1) or self.block_size > 256:
            raise ConfigError(f"block_size must be a power of two <= 256, got {self.block_size}")
        for name in ("num_kv_blocks", "max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.max_mixed_graph_tokens, int) or self.max_mixed_graph_tokens < 0:
            raise ConfigError(
                f"max_mixed_graph_tokens must be an integer >= 0, got {self.max_mixed_graph_tokens!r}"
            )
        for name in ("mla_expand_min_tokens", "mla_expand_max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
        if (
            not isinstance(self.long_prefill_token_threshold, int)
            or self.long_prefill_token_threshold < 0
        ):
            raise ConfigError(
                "long_prefill_token_threshold must be an integer >= 0, "
                f"got {self.long_prefill_token_threshold!r}"
            )
        for name in ("streaming_window", "sink_tokens", "limit_images_per_prompt"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
        _positive(self, "streaming_max_len", "max_image_pixels")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ConfigError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.step_timeout_s is not None and not self.step_timeout_s > 0:
            raise ConfigError(f"step_timeout_s must be > 0 or None, got {self.step_timeout_s}")
        for name in ("grammar_compile_timeout_s", "orphan_stop_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        _positive(self, "grammar_threads", "tensor_parallel_size")
        if self.cpu_kernel_threads < 0:
            raise ConfigError(f"cpu_kernel_threads must be >= 0, got {self.cpu_kernel_threads}")
        if self.gil_switch_interval_s is not None and not self.gil_switch_interval_s > 0:
            raise ConfigError(
                f"gil_switch_interval_s must be > 0 or None, got {self.gil_switch_interval_s}"
            )
        if self.tensor_parallel_size > 1 and self.runner != "model":
            raise ConfigError(
                f"tensor_parallel_size {self.tensor_parallel_size} needs runner 'model', "
                f"got {self.runner!r}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        for name, allowed in field_choices().items():
            if (value := getattr(self, name)) not in allowed:
                names = ", ".join(a for a in allowed if a is not None)
                raise ConfigError(f"{name} must be one of {names}; got {value!r}")
        check_speculative(self)
        if self.disaggregation != "none":
            check_disaggregation(self)
        if isinstance(self.lora_modules, list):  # from JSON (a trace's config, ops/replay.py)
            object.__setattr__(self, "lora_modules", tuple(self.lora_modules))
        check_lora(self)
        check_prompt_embeds(self)
        check_generation_config(self)
        check_pipeline(self)
        if not isinstance(self.enable_overlap_schedule, bool):
            raise ConfigError(
                f"enable_overlap_schedule must be a bool, got {self.enable_overlap_schedule!r}"
            )

    @property
    def executor_proposes(self) -> bool:
        """Whether proposals come from the executor (a draft model or an EAGLE head)."""
        return self.speculative_method in ("draft_model", "eagle", "eagle3", "mtp")

    @property
    def num_proposals(self) -> int:
        """Tokens proposed per request per step: 0 when speculative decoding is off."""
        return (self.num_speculative_tokens or 0) if self.speculative_method is not None else 0

    def step_budget(self, large_gpu: bool = False) -> int:
        """max_num_batched_tokens, or its default (`large_gpu`: the engine runs on a CUDA device
        of >= 70 GiB that is not an A100; gpu/runner_setup.is_large_gpu says)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 8192 if large_gpu else 4096

    @property
    def template_defaults_json(self) -> str | None:
        return template_defaults_json(self)  # config_checks.py

    @property
    def lora_adapters(self) -> dict[str, str]:
        """The LoRA adapters by name: their folders (lora_modules, checked)."""
        return dict(entry.split("=", 1) for entry in self.lora_modules)

    def replace(self, **changes: object) -> EngineConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def field_choices() -> dict[str, tuple[str | None, ...]]:
    """Each field's allowed values: its Literal's, or its registry's keys as they are now."""
    return _literal_choices() | {name: tuple(r) for name, r in NAMED_BY_REGISTRY.items()}


@functools.cache
def _literal_choices() -> dict[str, tuple[str | None, ...]]:
    """Each Literal field's allowed values (and None where the field is optional)."""
    choices: dict[str, tuple[str | None, ...]] = {}
    for name, hint in typing.get_type_hints(EngineConfig).items():
        for arg in (hint, *get_args(hint)):
            if get_origin(arg) is Literal:
                choices[name] = get_args(arg) + ((None,) if type(None) in get_args(hint) else ())
    return choices
