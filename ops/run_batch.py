"""`troupe run-batch`: an OpenAI Batch API file through an in-process engine, as vLLM's
`python -m vllm.entrypoints.openai.run_batch -i in.jsonl -o out.jsonl --model ...`.

    troupe run-batch -i requests.jsonl -o answers.jsonl [engine flags] [--tool-call-parser ...]

Every line is answered by the code that answers it over HTTP (gateway/json_calls.py): the same
parsing and errors, chat template, tools, structured output, reasoning parser, LoRA adapters
named by `model`, embeddings, scores; the file formats are in ops/batch_lines.py. Input is a
file or `-` (stdin), read as lines arrive; output a file or `-` (stdout), in input order, each
answer written once the ones before it are. http(s) URLs, which vLLM downloads and uploads, are
refused: fetch the file first (`curl -sf URL | troupe run-batch -i - -o out.jsonl`).

Concurrency: up to min(2 * max_num_seqs, max_num_seqs + max_queued_requests) lines run at once:
vLLM's window of 2 * max_num_seqs keeps every sequence slot busy with the next lines queued in
the engine, and the cap keeps it within what admission holds, which turns away the excess
(vLLM's queue is unbounded; ours is not). The file is never held whole. A line the engine turns
away as overloaded (its prompts or samples fanned out past what admission holds beside the
other lines) runs again once another line finishes; with no other line running, its 429 stands.
If the engine fails, reading stops, the lines in flight get their errors and the command exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import IO

from tqdm import tqdm
from troupe.config import ConfigError, EngineConfig
from troupe.gateway.json_calls import JSON_CALLS, Answer, answer
from troupe.gateway.settings import add_settings_arguments, settings_from_args
from troupe.gateway.state import Gateway
from troupe.ops.batch_lines import BatchLine, LineReader, OrderedWriter, Refused, output_line

# The gateway settings that shape answers; the others are about HTTP clients.
ANSWER_SETTINGS = (
    "reasoning_parser",
    "tool_call_parser",
    "enable_auto_tool_choice",
    "pooling_type",
    "max_embedding_inputs",
    "max_prompts_per_request",
    "served_model_name",
    "return_tokens_as_token_ids",
)


class BatchFileError(Exception):
    """An input or output the command cannot use."""


def add_run_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """The files, the progress bar, and the gateway settings that shape answers (the CLI adds
    the EngineConfig flags)."""
    group = parser.add_argument_group("batch")
    group.add_argument("-i", "--input-file", required=True, help="requests (.jsonl); - is stdin")
    group.add_argument("-o", "--output-file", required=True, help="answers (.jsonl); - is stdout")
    group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a progress bar on stderr (the closing summary line is always written)",
    )
    add_settings_arguments(parser, names=ANSWER_SETTINGS)


def window_for(config: EngineConfig) -> int:
    """How many lines run at once (see the module's docstring)."""
    return min(2 * config.max_num_seqs, config.max_num_seqs + config.max_queued_requests)


def run_batch_command(ns: argparse.Namespace, config: EngineConfig) -> int:
    """Run the batch; 0 when every line got its answer line (failed requests included), 1 if
    the engine failed or refused to start, 2 for bad flags or files."""
    from troupe.actors.engine import Engine
    from troupe.actors.engine_stopped import EngineStopped
    from troupe.gateway.server import is_start_error

    try:
        settings = settings_from_args(ns)
        with _opened(ns.input_file, "rb") as source, _opened(ns.output_file, "wb") as sink:

            async def main() -> int:
                async with Engine.open(config) as engine:
                    gateway = Gateway(engine, settings)
                    writer = OrderedWriter(sink.write, sink.flush)
                    progress = Progress(is_shown=ns.progress)
                    await run_batch(gateway, _lines(source), writer, window_for(config), progress)
                    progress.close(ns.output_file)
                    return 0 if engine.is_healthy else 1

            return asyncio.run(main())
    except (ConfigError, BatchFileError) as exc:
        print(f"troupe run-batch: {exc}", file=sys.stderr)
        return 2
    except EngineStopped as exc:
        print(f"troupe run-batch: {exc}; the lines before it are written", file=sys.stderr)
        return 1
    except ValueError as exc:
        if not is_start_error(exc):
            raise
        print(f"troupe run-batch: {exc}", file=sys.stderr)  # a bad model or setting
        return 1


class Progress:
    """A tqdm bar on stderr (its total known once the input ends) and a closing summary."""

    def __init__(self, *, is_shown: bool) -> None:
        line_by_line = not sys.stderr.isatty()  # a log file: whole lines, not \r redraws
        self._bar = tqdm(
            desc="run-batch",
            unit="req",
            file=sys.stderr,
            disable=not is_shown,
            mininterval=5.0 if line_by_line else 0.1,
            bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"
            if line_by_line
            else None,
        )
        self.num_lines = 0
        self.num_ok = 0
        self.num_retries = 0
        self._started = time.monotonic()

    def read(self) -> None:
        self.num_lines += 1

    def answered(self, answer: Answer) -> None:
        self.num_ok += answer.status == 200
        self._bar.update()

    def input_done(self) -> None:
        self._bar.total = self.num_lines
        self._bar.refresh()

    def close(self, output: str) -> None:
        self._bar.close()
        seconds = time.monotonic() - self._started
        failed = self.num_lines - self.num_ok
        print(
            f"run-batch: {self.num_lines} lines, {self.num_ok} answered, {failed} failed, "
            f"{self.num_retries} retried after overload, in {seconds:.1f} s -> {output}",
            file=sys.stderr,
        )


async def run_batch(
    gateway: Gateway,
    lines: AsyncIterator[bytes],
    writer: OrderedWriter,
    window: int,
    progress: Progress,
) -> None:
    """Answer every line, `window` at a time, writing each answer line in input order."""
    reader = LineReader(JSON_CALLS)

    async def ask(line: BatchLine) -> Answer:
        return await answer(gateway, line.url, bytes(line.body))

    flight = Flight(ask, progress)
    slots = asyncio.Semaphore(window)

    async def run(index: int, line: BatchLine) -> None:
        try:
            got = await flight.answer(line)
            writer.put(index, output_line(line.custom_id, got))
            progress.answered(got)
        finally:
            slots.release()

    async with asyncio.TaskGroup() as tg:
        index = number = 0
        async for raw in lines:
            number += 1
            if not raw.strip():
                continue
            if not gateway.engine.is_healthy:
                break  # the lines in flight end with the engine's errors
            progress.read()
            item = reader.read(raw, number)
            if isinstance(item, Refused):
                writer.put(index, output_line(item.custom_id, item.answer))
                progress.answered(item.answer)
            else:
                await slots.acquire()
                tg.create_task(run(index, item))
            index += 1
        progress.input_done()


class Flight:
    """The lines being answered, and the retry of one turned away as overloaded: it waits for
    another line to finish, unless no other is running (then nothing will make room)."""

    def __init__(self, ask: Callable[[BatchLine], Awaitable[Answer]], progress: Progress) -> None:
        self._ask = ask
        self._progress = progress
        self._num_running = 0  # lines in flight, less those waiting to run again
        self._num_finished = 0
        self._finished = asyncio.Condition()

    async def answer(self, line: BatchLine) -> Answer:
        self._num_running += 1
        try:
            while True:
                got = await self._ask(line)
                if not _is_overloaded(got) or self._num_running == 1:
                    return got
                self._progress.num_retries += 1
                await self._wait_for_a_finish()
        finally:
            self._num_running -= 1
            self._num_finished += 1
            async with self._finished:
                self._finished.notify_all()

    async def _wait_for_a_finish(self) -> None:
        """Until another line finishes (this one does not count as running meanwhile)."""
        seen = self._num_finished
        self._num_running -= 1
        try:
            async with self._finished:
                await self._finished.wait_for(lambda: self._num_finished > seen)
        finally:
            self._num_running += 1


def _is_overloaded(got: Answer) -> bool:
    error = got.error
    return got.status == 429 and error is not None and error.get("code") == "overloaded"


async def _lines(source: IO[bytes]) -> AsyncIterator[bytes]:
    """The input's lines, each read off the event loop (stdin may be a slow pipe, and the
    engine's actors share this loop)."""
    while line := await asyncio.to_thread(source.readline):
        yield line


@contextlib.contextmanager
def _opened(path: str, mode: str) -> Iterator[IO[bytes]]:
    """A local file, or `-` for stdin / stdout (not closed)."""
    if path.startswith(("http://", "https://")):
        raise BatchFileError(
            f"{path!r:.80}: only local files and - are read and written (no downloads or "
            "uploads): fetch it first, e.g. `curl -sf URL | troupe run-batch -i - ...`"
        )
    if path == "-":
        yield sys.stdin.buffer if "r" in mode else sys.stdout.buffer
        return
    try:
        file = open(path, mode)  # closed below, after the yield
    except OSError as exc:
        raise BatchFileError(f"cannot open {path!r:.80}: {exc.strerror}") from None
    with file:
        yield file
