"""Trace replay: re-drive every actor core from its recorded inbox and compare what it sends.

Each core is a deterministic function of its inbox batches, so replaying the recorded batches
through fresh cores (built by the graph's own factories from the config and runner numbers in
the trace header) must reproduce every message
the actor sent, byte for byte. The executor is not re-run: its recorded StepResults are part of
the scheduler's inbox, so a GPU trace replays on a CPU with no model.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from troupe.actors.graph import GraphInputs, load_tokenizer_for
from troupe.actors.request_input import RequestInputError, check_params
from troupe.actors.wiring import graph_specs
from troupe.config import EngineConfig
from troupe.messages import GenerateRequest
from troupe.messages.trace import (
    RunnerNumbers,
    TraceError,
    TraceHeader,
    TraceRecord,
    encode_message,
    read_trace,
)


@dataclass(frozen=True)
class Divergence:
    """The first message that differs: on `channel` (receiving actor), the `index`-th message
    `actor` sent there."""

    actor: str
    channel: str
    index: int
    expected: Any
    got: Any
    seq: int  # trace position of the expected record (or of the last one, if it is missing)

    def describe(self) -> str:
        return (
            f"divergence on channel {self.channel!r} (sent by {self.actor}), message #{self.index}:\n"
            f"  expected: {_show(self.expected)}\n  got:      {_show(self.got)}"
        )


@dataclass(frozen=True)
class ReplayReport:
    num_records: int
    num_checked: int  # sent messages compared
    actors: tuple[str, ...]
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _show(msg: Any) -> str:
    if msg is None:
        return "<nothing>"
    text = msgspec.json.encode(msg).decode() if isinstance(msg, msgspec.Struct) else repr(msg)
    return text if len(text) <= 600 else text[:600] + "..."


def replay_trace(path: str | Path) -> ReplayReport:
    """Replay every core actor of the trace; raises TraceError for an unreadable file."""
    header, records = read_trace(path)
    inbox: dict[str, dict[int, list[msgspec.Struct]]] = defaultdict(lambda: defaultdict(list))
    sent: dict[str, list[TraceRecord]] = defaultdict(list)
    for rec in records:
        if rec.kind == "recv":
            inbox[rec.actor][rec.batch].append(rec.msg)
        else:
            sent[rec.actor].append(rec)
    inputs = graph_inputs(header)
    _check_inputs(inbox["tokenizer"], inputs.numbers.vocab_size)
    specs = tuple(s for s in graph_specs(executor_in_thread=False) if s.name != "executor")
    actors = tuple(spec.name for spec in specs)
    first: Divergence | None = None
    num_checked = 0
    for actor, spec in zip(actors, specs, strict=True):
        core = spec.build(inputs)
        got: list[tuple[str, msgspec.Struct]] = []
        for batch_no in sorted(inbox[actor]):
            got.extend(core.handle(inbox[actor][batch_no]))
        divergence, checked = _compare(actor, sent[actor], got, records)
        num_checked += checked
        if divergence is not None and (first is None or divergence.seq < first.seq):
            first = divergence
    return ReplayReport(len(records), num_checked, actors, first)


def graph_inputs(header: TraceHeader) -> GraphInputs:
    """What built the recorded graph's cores (the executor's runner aside)."""
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    config = EngineConfig(**{k: v for k, v in header.engine_config.items() if k in names})
    numbers = header.runner
    if numbers is None:  # a trace from before RunnerNumbers: read them from the core arguments
        scheduler, admission = header.core_args["scheduler"], header.core_args["admission"]
        numbers = RunnerNumbers(
            block_size=scheduler["block_size"],
            num_gpu_blocks=scheduler["num_gpu_blocks"],
            num_cpu_blocks=scheduler["num_cpu_blocks"],
            vocab_size=admission["vocab_size"],
            max_model_len=admission["max_model_len"],
            eos_token_ids=tuple(scheduler["eos_token_ids"]),
            num_lookahead_tokens=scheduler.get("num_lookahead_tokens", 0),
        )
    return GraphInputs(
        config,
        numbers,
        load_tokenizer_for(config.model, config.chat_template, config.template_defaults_json),
    )


def _check_inputs(batches: dict[int, list[msgspec.Struct]], vocab_size: int | None) -> None:
    """Client requests go through the same check as at the engine's edge: a trace holding one
    that the engine would have refused is not a trace of this engine (TraceError)."""
    for batch_no in sorted(batches):
        for msg in batches[batch_no]:
            if isinstance(msg, GenerateRequest):
                try:
                    check_params(msg.params, vocab_size=vocab_size)
                except RequestInputError as exc:
                    raise TraceError(
                        f"tokenizer batch {batch_no}: request {msg.request_id!r} has invalid "
                        f"{exc.field}: {exc}; the engine refuses it before the graph"
                    ) from exc


def _compare(
    actor: str,
    expected: list[TraceRecord],
    got: list[tuple[str, msgspec.Struct]],
    records: list[TraceRecord],
) -> tuple[Divergence | None, int]:
    by_channel_expected: dict[str, list[TraceRecord]] = defaultdict(list)
    for sent in expected:
        by_channel_expected[sent.channel].append(sent)
    by_channel_got: dict[str, list[msgspec.Struct]] = defaultdict(list)
    for channel, message in got:
        by_channel_got[channel].append(message)
    first: Divergence | None = None
    checked = 0
    last_seq = records[-1].seq if records else 0
    for channel in sorted(set(by_channel_expected) | set(by_channel_got)):
        exp, out = by_channel_expected[channel], by_channel_got[channel]
        for index in range(max(len(exp), len(out))):
            rec: TraceRecord | None = exp[index] if index < len(exp) else None
            msg: msgspec.Struct | None = out[index] if index < len(out) else None
            checked += 1
            if (
                rec is not None
                and msg is not None
                and encode_message(rec.msg) == encode_message(msg)
            ):
                continue
            seq = rec.seq if rec is not None else last_seq + 1
            found = Divergence(actor, channel, index, rec.msg if rec else None, msg, seq)
            if first is None or found.seq < first.seq:
                first = found
            break
    return first, checked
