"""Executor set-up: the only place outside the executor core that touches gpu/.

Builds the runner (model load, KV pools sized from memory) off the event loop and derives the
numbers every other core is built from (RunnerNumbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.actors.graph import GraphInputs
from troupe.actors.wiring import ActorSpec, graph_specs
from troupe.config import DEFAULT_MODEL_NAME, ConfigError, EngineConfig, resolve_model_path
from troupe.gpu.classifier_config import ClassifierConfig, read_folder_classifier
from troupe.gpu.embeds_width import image_rows, prompt_embeds_width, whole_images
from troupe.gpu.runner import Runner, build_runner
from troupe.messages.trace import RunnerNumbers


@dataclass(frozen=True)
class ExecutorSetup:
    config: EngineConfig  # the engine's, with what depends on the device resolved
    runner: Runner
    numbers: RunnerNumbers
    model_path: str
    model_name: str
    is_blocking: bool  # the runner does real (GPU or CPU model) work: run it in a worker thread
    # prefill/decode disaggregation: the prefill side (`runner` is the decode side; closing
    # either stops both workers: gpu/pd_runner.py)
    prefill_runner: Runner | None = None

    def graph_inputs(self, tokenizer: TextTokenizer) -> GraphInputs:
        return GraphInputs(self.config, self.numbers, tokenizer, self.runner, self.prefill_runner)

    def graph_specs(self) -> tuple[ActorSpec, ...]:
        return graph_specs(
            executor_in_thread=self.is_blocking, disaggregated=self.prefill_runner is not None
        )


def start_executor(config: EngineConfig, runner: Runner | None = None) -> ExecutorSetup:
    """Load the model and size the pools (blocking: run it in a worker thread).

    `runner`: drive this one instead of building what the config asks for (fault injection)."""
    if config.runner == "model" and runner is None:
        from troupe.gpu.runner_setup import with_step_budget  # torch: only for a real model

        config = with_step_budget(config)
    path = resolve_model_path(config.model)
    injected = runner is not None
    prefill_runner: Runner | None = None
    if runner is None and config.disaggregation == "prefill_decode":
        from troupe.gpu.pd_runner import launch_disaggregated

        prefill_runner, runner = launch_disaggregated(config)
    elif runner is not None and config.disaggregation != "none":
        raise ConfigError("an injected runner cannot serve disaggregation (it builds its own)")
    if runner is None:
        runner = build_runner(config)
    max_model_len = runner.max_model_len
    if config.max_model_len is not None:
        max_model_len = min(max_model_len, config.max_model_len)
    # Every admitted request must fit the GPU pool alone (with its lookahead slot); a longer
    # one could only fail after streaming tokens, so cap the length: admission then rejects
    # such prompts up front (400 too_long) and generation stops at the cap (finish "length").
    capacity = runner.num_gpu_blocks * runner.block_size - runner.num_lookahead_tokens
    max_model_len = max(1, min(max_model_len, capacity))
    classifier = _classifier(config, path) if not injected else None
    numbers = RunnerNumbers(
        block_size=runner.block_size,
        num_gpu_blocks=runner.num_gpu_blocks,
        num_cpu_blocks=runner.num_cpu_blocks,
        vocab_size=runner.vocab_size,
        max_model_len=max_model_len,
        eos_token_ids=tuple(runner.eos_token_ids),
        # an overlapping runner needs each decode's next KV slot already in its table
        num_lookahead_tokens=runner.num_lookahead_tokens,
        kv_window=runner.kv_window,
        kv_pages_on_write=runner.kv_pages_on_write,
        max_stream_len=runner.max_stream_len,
        classifier_labels=() if classifier is None else classifier.labels,
        is_token_classifier=classifier is not None and classifier.is_per_token,
        prompt_embeds_width=prompt_embeds_width(runner) if config.enable_prompt_embeds else 0,
        image_rows=image_rows(runner),
        whole_images=whole_images(runner),
    )
    return ExecutorSetup(
        config=config,
        runner=runner,
        numbers=numbers,
        model_path=str(path),
        model_name=model_name(config.model, path),
        is_blocking=injected or config.runner != "fake",
        prefill_runner=prefill_runner,
    )


def _classifier(config: EngineConfig, path: Path) -> ClassifierConfig | None:
    """A classification model's head (None for a causal LM); the engine then serves classify
    requests only. Refused where its score head is not run: a fake runner, tensor parallelism,
    a disaggregated prefill, speculative decoding."""
    try:
        classifier = read_folder_classifier(path)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from exc
    if classifier is None:
        return None
    refused = (
        ("runner", config.runner != "model"),
        ("tensor_parallel_size", config.tensor_parallel_size > 1),
        ("disaggregation", config.disaggregation != "none"),
        ("speculative_method", config.speculative_method is not None),
    )
    for field, is_set in refused:
        if is_set:
            raise ConfigError(f"{field}: not supported with a classification model")
    return classifier


def model_name(model: str | None, path: Path) -> str:
    """The id clients use for the model (`/v1/models`)."""
    if model is None:
        return DEFAULT_MODEL_NAME
    return path.stem if path.is_file() else path.name
