"""How the graph's cores are built: one typed factory per actor, each reading only GraphInputs
(the EngineConfig, the runner's numbers, and the two shared objects: tokenizer and runner).
A trace header records the config and the numbers, so replay builds the same cores with the
same factories, without a model or a GPU (ops/replay.py)."""

from __future__ import annotations

import functools
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from troupe.actors.core.admission import AdmissionCore, StreamingDefaults
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.executor import ExecutorCore
from troupe.actors.core.grammar import GrammarCore
from troupe.actors.core.grammar_compiler import (
    GrammarCompiler,
    grammar_compiler_for,
    grammar_vocab,
)
from troupe.actors.core.phase_router import PhaseRouterCore
from troupe.actors.core.prompt_images import PromptImages, image_tokens
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.speculator import SpecSettings
from troupe.actors.core.step_limits import StepLimits
from troupe.actors.core.streamer import StreamerCore
from troupe.actors.core.tokenizer import TokenizerCore
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.actors.grammar_process import GrammarProcess
from troupe.config import ConfigError, EngineConfig, resolve_model_path
from troupe.gpu.runner import DrawsAhead, ReloadsWeights
from troupe.messages.phase_router import Phase
from troupe.messages.trace import RunnerNumbers

if TYPE_CHECKING:
    from troupe.gpu.runner import Runner


@functools.lru_cache(maxsize=4)
def load_tokenizer_for(
    model: str | None, chat_template: str | None = None, template_defaults: str | None = None
) -> TextTokenizer:
    """The tokenizer of `model` (None: the default model) with EngineConfig.chat_template and
    its template_defaults_json applied, loaded once per process and choice."""
    from troupe.actors.core.tokenizer_files import load_tokenizer

    return load_tokenizer(resolve_model_path(model), chat_template, template_defaults)


@dataclass(frozen=True, slots=True)
class GraphInputs:
    """All that a core factory may read."""

    config: EngineConfig
    numbers: RunnerNumbers
    tokenizer: TextTokenizer  # shared, read-only: see docs/architecture.md
    runner: Runner | None = None  # None on replay, which does not rebuild the executor
    prefill_runner: Runner | None = None  # disaggregation's prefill side (the other: runner)

    @property
    def is_disaggregated(self) -> bool:
        return self.config.disaggregation != "none"


def grammar_compiler(g: GraphInputs) -> GrammarCompiler:
    """The process's compiler for this tokenizer and vocabulary (shared, like the tokenizer:
    the tokenizer core compiles at the edge, the grammar core finds the result cached)."""
    return grammar_compiler_for(
        g.tokenizer,
        g.numbers.vocab_size,
        g.numbers.eos_token_ids,
        g.config.grammar_compile_timeout_s,
    )


def build_tokenizer(g: GraphInputs) -> TokenizerCore:
    # no grammars: structured output is refused (naming its field) with disaggregation
    grammars = None if g.is_disaggregated else grammar_compiler(g)
    return TokenizerCore(
        g.tokenizer,
        max_model_len=g.numbers.max_model_len,
        grammars=grammars,
        prompt_embeds_width=g.numbers.prompt_embeds_width,
        images=prompt_images_for(g) if g.numbers.image_rows else None,
    )


def prompt_images_for(g: GraphInputs) -> PromptImages:
    """The tokenizer's reader of the model's images: its processor's preprocessing and
    image tokens, read from the model folder (the runner said it takes images)."""
    from troupe.actors.core.image_prep import read_image_prep
    from troupe.gpu.vision_config import read_vision_config
    from troupe.gpu.vision_load import read_wrapper

    folder = Path(resolve_model_path(g.config.model))
    wrapper = read_wrapper(folder)
    vision = None if wrapper is None else read_vision_config(wrapper)
    prep = read_image_prep(folder)
    if wrapper is None or vision is None or prep is None:
        raise ConfigError(
            f"{folder}: the runner takes images, but the folder's config.json or "
            "preprocessor_config.json describes none"
        )
    tokens = image_tokens(vision, wrapper, g.tokenizer.tokenizer.id_to_token)
    if tokens.num_rows != g.numbers.image_rows:
        raise ConfigError(
            f"{folder}: the processor writes {tokens.num_rows} image tokens per "
            f"image, the encoder makes {g.numbers.image_rows} rows"
        )
    config = g.config
    return PromptImages(prep, tokens, config.limit_images_per_prompt, config.max_image_pixels)


def build_grammar(g: GraphInputs) -> GrammarCore | GrammarProcess:
    config = g.config
    if not _grammar_in_process(config):
        return GrammarCore(grammar_compiler(g), max_threads=config.grammar_threads)
    return GrammarProcess(
        grammar_vocab(g.tokenizer, g.numbers.vocab_size),
        vocab_size=g.numbers.vocab_size,
        eos_token_ids=g.numbers.eos_token_ids,
        timeout_s=config.grammar_compile_timeout_s,
        max_threads=config.grammar_threads,
        max_rows=config.max_num_seqs,
        pin=_pin_for(config),
    )


def _pin_for(config: EngineConfig) -> Callable[[mmap.mmap], Callable[[], None]] | None:
    """On CUDA, how the grammar process's mask file is page-locked (gpu/pinned_host.py)."""
    from troupe.gpu.runner_setup import uses_cuda  # torch: only when a grammar is built

    if not uses_cuda(config):
        return None
    from troupe.gpu.pinned_host import pin_host_buffer

    return pin_host_buffer


def _grammar_in_process(config: EngineConfig) -> bool:
    if config.grammar_worker != "auto":
        return config.grammar_worker == "process"
    from troupe.gpu.runner_setup import uses_cuda  # torch: only when a grammar is built

    return uses_cuda(config)


def build_admission(g: GraphInputs) -> AdmissionCore:
    return AdmissionCore(
        max_model_len=g.numbers.max_model_len,
        vocab_size=g.numbers.vocab_size,
        num_labels=len(g.numbers.classifier_labels),
        is_token_classifier=g.numbers.is_token_classifier,
        max_num_seqs=g.config.max_num_seqs,
        max_queued_requests=g.config.max_queued_requests,
        max_queued_tokens=g.config.max_queued_tokens,
        # disaggregation: one sample per request (parallel sampling copies blocks on one side)
        max_num_samples=min(
            1 if g.is_disaggregated else g.config.max_num_samples,
            g.config.max_num_seqs,
            g.config.step_budget(),
        ),
        streaming=StreamingDefaults(
            g.config.streaming_window, g.config.sink_tokens, g.numbers.max_stream_len
        ),
        samples_limit=(
            "disaggregation 'prefill_decode' runs one sample per request"
            if g.is_disaggregated
            else "max_num_samples, capped by max_num_seqs"
        ),
        no_hidden_outputs=(
            "disaggregation 'prefill_decode' computes prompts on the prefill side, which "
            "returns no logits"
            if g.is_disaggregated
            else None
        ),
    )


def whole_image_chunks(g: GraphInputs) -> bool:
    """Whether prefill chunks must hold whole images (RunnerNumbers.whole_images); a step
    budget or chunk cap smaller than an image would never fit one: ConfigError naming it."""
    if not g.numbers.whole_images:
        return False
    rows, config = g.numbers.image_rows, g.config
    for name, value in (
        ("max_num_batched_tokens", config.step_budget()),
        ("long_prefill_token_threshold", config.long_prefill_token_threshold),
    ):
        if 0 < value < rows:
            raise ConfigError(
                f"{name} {value} is below the {rows} rows of one image, which this model "
                "computes in one chunk (its image rows attend to each other)"
            )
    return True


def build_scheduler(g: GraphInputs) -> SchedulerCore:
    return SchedulerCore(
        StepLimits(
            block_size=g.numbers.block_size,
            num_gpu_blocks=g.numbers.num_gpu_blocks,
            max_num_seqs=g.config.max_num_seqs,
            max_num_batched_tokens=g.config.step_budget(),
            enable_prefix_caching=g.config.enable_prefix_caching,
            num_lookahead_tokens=g.numbers.num_lookahead_tokens,
            kv_window=g.numbers.kv_window,
            max_chunk_tokens=g.config.long_prefill_token_threshold,
            max_loras=g.config.max_loras if g.config.lora_modules or g.config.enable_lora else 0,
            image_rows=g.numbers.image_rows if whole_image_chunks(g) else 0,
        ),
        num_cpu_blocks=g.numbers.num_cpu_blocks,
        preemption_mode=g.config.preemption_mode,
        scheduling_policy=g.config.scheduling_policy,
        eos_token_ids=g.numbers.eos_token_ids,
        speculative=SpecSettings.from_config(g.config),
        # disaggregation: a prompt's last token is the prefill side's to sample
        hold_last_prompt_token=g.numbers.num_lookahead_tokens > 0 and not g.is_disaggregated,
    )


def build_allocator(g: GraphInputs) -> AllocatorCore:
    return AllocatorCore(
        block_size=g.numbers.block_size,
        num_gpu_blocks=g.numbers.num_gpu_blocks,
        num_cpu_blocks=g.numbers.num_cpu_blocks,
        enable_prefix_caching=g.config.enable_prefix_caching,
        cpu_prefix_tier=g.config.prefix_cache_cpu_tier,
        warm_first=g.numbers.kv_pages_on_write,
    )


def build_executor(g: GraphInputs) -> ExecutorCore:
    if g.runner is None:
        raise ValueError("the executor core needs a runner (replay does not rebuild it)")
    runner = g.runner
    draw = runner.draw_ahead if isinstance(runner, DrawsAhead) else None
    return ExecutorCore(
        runner,
        phase=Phase.DECODE if g.is_disaggregated else None,
        draw_ahead=draw if g.config.draw_masked_ahead else None,
        reload_weights=runner.weights.from_disk if isinstance(runner, ReloadsWeights) else None,
        profiler_dir=g.config.profiler_dir,
    )


def build_prefill_executor(g: GraphInputs) -> ExecutorCore:
    if g.prefill_runner is None:
        raise ValueError("the prefill executor needs a prefill runner (disaggregation)")
    return ExecutorCore(g.prefill_runner, phase=Phase.PREFILL)


def build_phase_router(g: GraphInputs) -> PhaseRouterCore:
    return PhaseRouterCore(block_size=g.numbers.block_size, seed=g.config.seed)


def build_streamer(g: GraphInputs) -> StreamerCore:
    return StreamerCore(g.tokenizer)
