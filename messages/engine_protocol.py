"""The engine-process protocol: what `troupe serve`'s gateway and its engine child exchange.

One duplex byte stream (a Unix socketpair) joins the two processes (gateway/remote_engine.py
is the gateway's end, gateway/engine_process.py the child's). Each frame is a 4-byte big-endian
length, then one msgpack-encoded message: commands to the engine (`ToEngine`), replies from it
(`FromEngine`). Events travel in batches, one `EventBatch` for what the engine's router
delivered together (one scheduling step), never one frame per token.

    gateway                                   engine child
       │                  Hello | StartFailed     │  once, after the engine started (or not)
       │ ◄─────────────────────────────────────── │
       │ Generate, Abort, AbortAll                │
       │ ───────────────────────────────────────► │
       │                  EventBatch (per step)   │
       │ ◄─────────────────────────────────────── │
       │ QueryGraphStats ──► GraphStatsReply      │  on demand (the live view), in order
       │ LoadLora | UnloadLora ──► LoraReply      │  by call_id, as each one ends
       │ ResetCache | UpdateWeightsFromDisk       │  the engine's calls (actors/engine_admin.py)
       │ | SleepEngine | WakeEngine               │  (sleep mode: messages/sleep_calls.py)
       │ | ProfileEngine                          │  (the profiler: messages/profile_calls.py)
       │                ──► EngineCallReply       │  by call_id, as each one ends
       │ Shutdown (or the socket closes)          │
       │ ───────────────────────────────────────► │
       │                  Stopped (error or None) │  last frame; then the child exits
       │ ◄─────────────────────────────────────── │
"""

from __future__ import annotations

import struct
from typing import Literal

import msgspec
from troupe.messages.common import LoraErrorCode
from troupe.messages.engine_calls import EngineCallsInbox
from troupe.messages.events import EngineStats, StreamEvent
from troupe.messages.graph_stats import GraphStats
from troupe.messages.sampling_defaults import SamplingDefaults
from troupe.messages.sleep_calls import SleepMode
from troupe.messages.tokenizer import GenerateRequest

_LEN = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30  # a length past this is a corrupt stream, not a message


# -- commands (gateway -> engine) ------------------------------------------------------------


class Generate(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Start a request, already checked at the gateway's client edge (arrival time included)."""

    request: GenerateRequest


class Abort(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    request_id: str
    reason: str


class AbortAll(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str


class Shutdown(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop: abort what is left, give it `grace` seconds for its terminal events, exit."""

    grace: float = 5.0


class QueryGraphStats(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask for the actors' counts now (the live view); answered by one GraphStatsReply, in
    the order asked."""


class LoadLora(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """`engine.loras.load(name, path)`; answered by a LoraReply of the same call_id once it
    ends (a load reads files: other commands go on meanwhile, so replies come as loads end)."""

    call_id: int
    name: str
    path: str


class UnloadLora(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """`engine.loras.unload(name)`; answered by a LoraReply of the same call_id."""

    call_id: int
    name: str


class ResetCache(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """`engine.reset_prefix_cache()`; answered by an EngineCallReply of the same call_id."""

    call_id: int


class UpdateWeightsFromDisk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """`engine.update_weights_from_disk(...)`; answered by an EngineCallReply of the same
    call_id once the update ended (it waits for the requests in flight: other commands go on)."""

    call_id: int
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False


class SleepEngine(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """`engine.sleep(level, mode=...)`; answered by an EngineCallReply of the same call_id."""

    call_id: int
    level: int
    mode: SleepMode = "refuse"


class ProfileEngine(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """`engine.start_profile(...)` (`start`) or `engine.stop_profile()`; answered by an
    EngineCallReply of the same call_id (messages/profile_calls.py)."""

    call_id: int
    start: bool
    record_shapes: bool = False
    with_stack: bool = False


class WakeEngine(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """`engine.wake_up(tags)` (empty: all); answered by an EngineCallReply of the same call_id."""

    call_id: int
    tags: tuple[str, ...] = ()  # as the caller gave them: the engine checks them


ToEngine = (
    Generate
    | Abort
    | AbortAll
    | Shutdown
    | QueryGraphStats
    | LoadLora
    | UnloadLora
    | ResetCache
    | UpdateWeightsFromDisk
    | SleepEngine
    | WakeEngine
    | ProfileEngine
)


# -- replies (engine -> gateway) -------------------------------------------------------------


class LoraAdapter(msgspec.Struct, frozen=True, kw_only=True):
    """A LoRA adapter the engine serves (EngineConfig.lora_modules, or loaded at run time): a
    request's `model` may name it (gateway/served_models.py)."""

    name: str
    path: str  # its folder, as configured (GET /v1/models shows it as `root`)


class Hello(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The engine is serving: what the gateway needs to know about it."""

    model_name: str
    max_model_len: int
    pid: int
    eos_token_ids: tuple[int, ...] = ()  # the model's (beam search ends a beam on them)
    lora_adapters: tuple[LoraAdapter, ...] = ()  # in the order configured
    classifier_labels: tuple[str, ...] = ()  # a classification model's (POST /classify)
    is_token_classifier: bool = False  # its labels are per token (token_classify only)
    # for the fields a request leaves unset (the model's generation_config: the gateway fills)
    sampling_defaults: SamplingDefaults = msgspec.field(default_factory=SamplingDefaults)


class LoraCallError(msgspec.Struct, frozen=True, kw_only=True):
    """Why a LoadLora or UnloadLora failed: the gateway raises `error_type` again (the
    registry's LoraAdapterError with `field` and `code`, the runner's ConfigError when the
    adapter's files do not fit the model, RuntimeError for anything else)."""

    error_type: Literal["LoraAdapterError", "ConfigError", "other"]
    message: str
    field: str | None = None
    code: LoraErrorCode | None = None


class LoraReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The end of a LoadLora or UnloadLora, and the adapters a request may name once it
    ended: the engine's registry owns them, the gateway shows them (GET /v1/models)."""

    call_id: int
    adapters: tuple[LoraAdapter, ...]
    error: LoraCallError | None = None


class EngineCallReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The end of a ResetCache or UpdateWeightsFromDisk: the engine's reply, or why there is
    none (`stopped`: the engine stopped first; the gateway raises EngineStopped)."""

    call_id: int
    reply: EngineCallsInbox | None = None
    stopped: str | None = None


class StartFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The engine did not start; the gateway raises `error_type` again with `message`."""

    error_type: Literal["ConfigError", "ModelLoadError", "TokenizerLoadError", "other"]
    message: str


class EventBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Events the engine delivered together, the latest stats, and when they were delivered
    (the engine's time.monotonic(): CLOCK_MONOTONIC, one clock for every process of the
    machine, so the gateway's listeners see the engine's own times)."""

    events: tuple[StreamEvent, ...]
    stats: EngineStats | None
    time: float


class Stopped(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The last frame: the engine stopped, cleanly (error None) or because it failed."""

    error: str | None = None


class GraphStatsReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    graph: GraphStats


FromEngine = (
    Hello | StartFailed | EventBatch | Stopped | GraphStatsReply | LoraReply | EngineCallReply
)


# -- framing ---------------------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()


def encode_frame(message: ToEngine | FromEngine) -> bytes:
    """One frame: the length, then the msgpack body."""
    body = _encoder.encode(message)
    return _LEN.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The body length a 4-byte header announces; ValueError if it cannot be a frame."""
    (length,) = _LEN.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"engine protocol: frame of {length} bytes (corrupt stream?)")
    return int(length)


HEADER_BYTES = _LEN.size


class FrameSplitter:
    """Cuts a byte stream into frame bodies, whatever the chunks it arrives in."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The bodies of every frame `data` completes (possibly none)."""
        buffer = self._buffer
        buffer += data
        bodies: list[bytes] = []
        start = 0
        while len(buffer) - start >= HEADER_BYTES:
            length = frame_length(bytes(buffer[start : start + HEADER_BYTES]))
            end = start + HEADER_BYTES + length
            if len(buffer) < end:
                break
            bodies.append(bytes(buffer[start + HEADER_BYTES : end]))
            start = end
        del buffer[:start]
        return bodies


to_engine_decoder = msgspec.msgpack.Decoder(ToEngine)
from_engine_decoder = msgspec.msgpack.Decoder(FromEngine)
