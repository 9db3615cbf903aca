"""Trace codec: every message on every channel, as length-framed msgpack.

File layout (each frame = 4-byte big-endian length, then one msgpack object):

    frame 0      TraceHeader   (format version, what built the graph)
    frame 1..n   TraceRecord   (seq, time, kind, actor, channel, batch, message)

msgpack has no streaming decoder, so frames carry their own length; a short or unparsable frame
raises TraceError naming the frame and the byte offset.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgspec
from troupe.messages.admission import AdmissionInbox
from troupe.messages.allocator import AllocatorInbox
from troupe.messages.engine_calls import EngineCallsInbox
from troupe.messages.events import ClientInbox
from troupe.messages.executor import ExecutorInbox
from troupe.messages.grammar import GrammarInbox
from troupe.messages.scheduler import SchedulerInbox
from troupe.messages.streamer import StreamerInbox
from troupe.messages.tokenizer import TokenizerInbox

TRACE_VERSION = 1
_LEN = struct.Struct(">I")

AnyMessage = (
    TokenizerInbox
    | AdmissionInbox
    | SchedulerInbox
    | AllocatorInbox
    | ExecutorInbox
    | GrammarInbox
    | StreamerInbox
    | ClientInbox
    | EngineCallsInbox
)


class TraceError(Exception):
    """The trace file is unreadable: truncated, corrupt, or of another version."""


class RunnerNumbers(msgspec.Struct, frozen=True, kw_only=True):
    """What the loaded runner decided that the cores are built from, beside the EngineConfig."""

    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    vocab_size: int
    max_model_len: int  # the model's, capped by the config and by the GPU pool
    eos_token_ids: tuple[int, ...]
    num_lookahead_tokens: int = 0  # KV slots a decode's table covers past its tokens
    kv_window: int = 0  # KV wholly behind every layer's sliding window is released
    # the device pool's memory is committed as blocks are first written (the CPU): the
    # allocator reuses written blocks, evicting cached ones, before it touches new ones
    kv_pages_on_write: bool = False
    max_stream_len: int = 0  # StreamingLLM requests may run this long (0: not supported)
    # a sequence-classification model's labels (gpu/classifier_config.py); (): a causal LM
    classifier_labels: tuple[str, ...] = ()
    # the hidden size of the input-embedding rows requests may give (EngineConfig.
    # enable_prompt_embeds); 0: refused
    prompt_embeds_width: int = 0
    # the rows the runner's vision encoder makes of one image (messages/images.py); 0: the
    # runner takes no images
    image_rows: int = 0
    # an image's rows attend to each other (Gemma 3): the scheduler keeps each in one chunk
    whole_images: bool = False
    is_token_classifier: bool = False  # the labels are a *ForTokenClassification model's


class TraceHeader(msgspec.Struct, frozen=True, kw_only=True):
    """With the config and the runner's numbers, replay rebuilds the cores (actors/graph.py)."""

    version: int
    created: str  # ISO time, for people
    engine_config: dict[str, Any]
    runner: RunnerNumbers | None = None  # None: a trace from before, with `core_args` instead
    core_args: dict[str, dict[str, Any]] = {}  # before `runner`: each core's constructor args


class TraceRecord(msgspec.Struct, frozen=True, array_like=True):
    """`recv`: `actor` took `msg` from its inbox in batch `batch`.
    `send`: `actor` sent `msg` to `channel` (the receiving actor's name)."""

    seq: int
    time: float
    kind: Literal["recv", "send"]
    actor: str
    channel: str
    batch: int
    msg: AnyMessage


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(TraceHeader)
_record_decoder = msgspec.msgpack.Decoder(TraceRecord)


def encode_message(msg: msgspec.Struct) -> bytes:
    """Canonical bytes of a message (NaN-safe equality for replay comparisons)."""
    return _encoder.encode(msg)


class TraceWriter:
    """Appends frames to a file; thread actors record from their own threads (a lock)."""

    def __init__(self, path: str | Path, header: TraceHeader) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: BinaryIO = open(self.path, "wb")
        self._seq = 0
        self._write(_encoder.encode(header))

    def _write(self, payload: bytes) -> None:
        self._file.write(_LEN.pack(len(payload)))
        self._file.write(payload)

    def record(
        self,
        kind: Literal["recv", "send"],
        actor: str,
        channel: str,
        batch: int,
        msg: msgspec.Struct,
        time: float,
    ) -> None:
        with self._lock:
            rec = TraceRecord(self._seq, time, kind, actor, channel, batch, msg)  # type: ignore[arg-type]
            self._seq += 1
            self._write(_encoder.encode(rec))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


def _frames(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    offset, index = 0, 0
    while offset < len(data):
        if offset + _LEN.size > len(data):
            raise TraceError(f"truncated trace: frame {index} header cut off at byte {offset}")
        (size,) = _LEN.unpack_from(data, offset)
        start = offset + _LEN.size
        if start + size > len(data):
            raise TraceError(
                f"truncated trace: frame {index} at byte {offset} declares {size} bytes, "
                f"only {len(data) - start} remain"
            )
        yield index, offset, data[start : start + size]
        offset, index = start + size, index + 1


def read_trace(path: str | Path) -> tuple[TraceHeader, list[TraceRecord]]:
    """Read a whole trace; raises TraceError with the frame and byte offset of any damage."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from exc
    header: TraceHeader | None = None
    records: list[TraceRecord] = []
    for index, offset, payload in _frames(data):
        try:
            if header is None:
                header = _header_decoder.decode(payload)
                if header.version != TRACE_VERSION:
                    raise TraceError(
                        f"trace version {header.version} is not supported (expected {TRACE_VERSION})"
                    )
            else:
                records.append(_record_decoder.decode(payload))
        except msgspec.DecodeError as exc:
            raise TraceError(f"corrupt trace: frame {index} at byte {offset}: {exc}") from exc
    if header is None:
        raise TraceError(f"empty trace: {str(path)!r} has no header frame")
    return header, records
