"""What Engine.open waits for before it wires the graph: the runner and the tokenizer (and the
requests' sampling defaults, actors/generation_defaults.py), loaded side by side (blocking: run
it in a worker thread); and what the engine closes once its actors have stopped.

The model load spends much of its time in torch ops that release the GIL (the int4 repacking,
fbgemm's prepack of the int8 lm_head), so on a machine with a second core the tokenizer, and
the tables the streamer builds from it, load in the meantime: start-up takes about the model's
load instead of the sum (docs/benchmarks.md, "CPU start").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import anyio
from troupe.actors.core.detokenizer import shared_token_texts
from troupe.actors.core.tokenizer_bound import shared_count_bound
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.actors.executor import ExecutorSetup, start_executor
from troupe.actors.generation_defaults import read_sampling_defaults
from troupe.actors.grammar_process import GrammarProcess
from troupe.actors.graph import load_tokenizer_for
from troupe.actors.shell import Actor
from troupe.actors.switch_interval import switch_interval
from troupe.config import EngineConfig
from troupe.messages.sampling_defaults import SamplingDefaults
from troupe.messages.trace import TRACE_VERSION, TraceHeader, TraceWriter

if TYPE_CHECKING:
    from troupe.gpu.runner import Runner


def prepared_tokenizer(
    model: str | None, chat_template: str | None = None, template_defaults: str | None = None
) -> TextTokenizer:
    """The process's tokenizer for `model` with what the cores derive from it computed (the
    streamer's token texts for both skip settings, the tokenizer core's count bound), so
    building those cores on the event loop is cheap."""
    tokenizer = load_tokenizer_for(model, chat_template, template_defaults)
    for skip in (False, True):
        shared_token_texts(tokenizer, skip_special_tokens=skip)
    shared_count_bound(tokenizer)
    return tokenizer


def load_engine_parts(
    config: EngineConfig, runner: Runner | None = None
) -> tuple[ExecutorSetup, TextTokenizer, SamplingDefaults]:
    """start_executor(config, runner), and the tokenizer and the requests' sampling defaults
    in a second thread. A failure of any raises here (the runner's first: it names the model's
    problem; after a failure of the others the runner is closed)."""
    # The load thread gives up the GIL around each torch op; the engine's short switch
    # interval gets it back soon after, not 5 ms later (actors/switch_interval.py)
    with (
        switch_interval(config.gil_switch_interval_s),
        ThreadPoolExecutor(1, thread_name_prefix="tokenizer-load") as pool,
    ):
        defaults = pool.submit(read_sampling_defaults, config)
        tokenizer = pool.submit(
            prepared_tokenizer, config.model, config.chat_template, config.template_defaults_json
        )
        setup = start_executor(config, runner)
        try:
            return setup, tokenizer.result(), defaults.result()
        except BaseException:
            setup.runner.close()
            raise


async def close_engine_parts(setup: ExecutorSetup, actors: Sequence[Actor]) -> None:
    """The runner, then the grammar's child process and its page-locked mask file: now, not
    when the collector finds them (unregistered during another engine's CUDA-graph capture,
    the file invalidated that capture: tests/gpu opens engines one after another)."""
    if any(actor.is_hung for actor in actors):
        # The runner is stuck in a step; closing it may block too: bounded, abandoned.
        with anyio.move_on_after(5):
            await anyio.to_thread.run_sync(setup.runner.close, abandon_on_cancel=True)
    else:
        await anyio.to_thread.run_sync(setup.runner.close)
    for actor in actors:
        if isinstance(actor.core, GrammarProcess):
            await anyio.to_thread.run_sync(actor.core.close)


def open_trace(setup: ExecutorSetup) -> TraceWriter | None:
    """The message trace `EngineConfig.trace_path` asks for (its header: the config and the
    runner's numbers), None without one."""
    config = setup.config
    if not config.trace_path:
        return None
    header = TraceHeader(
        version=TRACE_VERSION,
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        engine_config=dataclasses.asdict(config),
        runner=setup.numbers,
    )
    return TraceWriter(config.trace_path, header)


async def close_failed_start(setup: ExecutorSetup, tracer: TraceWriter | None) -> None:
    """What a start that failed before its actors ran had opened: the trace, the runner (its
    device memory, for an app that tries again)."""
    with anyio.CancelScope(shield=True):
        if tracer is not None:
            tracer.close()
        await close_engine_parts(setup, ())
