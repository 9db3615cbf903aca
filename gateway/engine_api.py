"""The slice of `troupe.Engine` the gateway uses, as a Protocol (tests may pass a stand-in)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from troupe.messages import EngineStats, SamplingParams, StreamEvent
from troupe.messages.engine_calls import PrefixCacheReset, WeightsUpdated
from troupe.messages.graph_stats import GraphStats
from troupe.messages.profile_calls import ProfileReply
from troupe.messages.sampling_defaults import SamplingDefaults
from troupe.messages.sleep_calls import SleepMode, SleepReply

Prompt = str | Sequence[Mapping[str, Any]] | Sequence[int]


class TokenizerLike(Protocol):
    """The gateway's read-only tokenizer (actors/core/tokenizer_text.TextTokenizer)."""

    vocab_size: int
    chat_template: str | None  # the model's, as its files give it

    def encode(self, text: str, add_special_tokens: bool = True) -> Any: ...

    def encode_pair(self, first: str, second: str) -> list[int]: ...  # a cross-encoder's input

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def token_strs(self, token_ids: Sequence[int]) -> list[str]: ...  # vocabulary entries

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> str: ...


class LoraAdmin(Protocol):
    """LoRA adapters loaded and unloaded while the engine runs (POST /v1/load_lora_adapter):
    the in-process Engine's `loras` (actors/lora_registry.LoraRegistry), or RemoteLoras over
    the engine protocol. Both raise LoraAdapterError (its `field` and `code`), or ConfigError
    when the adapter's files do not fit the model; `EngineLike.lora_adapters` shows the
    outcome."""

    async def load(self, name: str, path: str) -> None: ...

    async def unload(self, name: str) -> None: ...


class EngineLike(Protocol):
    """What the gateway needs of an engine."""

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...  # beam search ends a beam on them

    @property
    def classifier_labels(self) -> tuple[str, ...]: ...  # a classification model's; () if not

    @property
    def is_token_classifier(self) -> bool: ...  # the labels are per token (token_classify)

    @property
    def sampling_defaults(self) -> SamplingDefaults: ...  # for the fields a body leaves unset

    @property
    def lora_adapters(self) -> Mapping[str, str]: ...  # name -> folder: what `model` may name

    @property
    def loras(self) -> LoraAdmin: ...

    @property
    def num_active(self) -> int: ...

    @property
    def is_healthy(self) -> bool: ...

    @property
    def failure(self) -> str | None: ...  # once the engine failed: why (actors/engine_death.py)

    async def wait_stopped(self) -> None: ...

    @property
    def tokenizer(self) -> TokenizerLike: ...

    def stats(self) -> EngineStats: ...

    async def graph_stats(self) -> GraphStats: ...

    def generate(
        self,
        prompt: Any,
        params: SamplingParams | Mapping[str, Any] | None,
        *,
        request_id: str | None = None,
    ) -> AsyncIterator[StreamEvent]: ...

    def add_event_listener(self, fn: Callable[[StreamEvent, float], None]) -> None: ...

    async def abort(self, request_id: str, reason: str = "aborted") -> None: ...

    async def abort_all(self, reason: str) -> None: ...

    # the engine's calls beside requests (actors/engine_admin.py); raise EngineStopped
    async def reset_prefix_cache(self) -> PrefixCacheReset: ...

    async def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None, *, abort_all_requests: bool = False
    ) -> WeightsUpdated: ...

    # sleep mode (messages/sleep_calls.py; gateway/sleep_routes.py)
    async def sleep(self, level: int = 1, *, mode: SleepMode = "refuse") -> SleepReply: ...

    async def wake_up(self, tags: Sequence[str] | None = None) -> SleepReply: ...

    async def is_sleeping(self) -> bool: ...

    # the torch profiler around the executor's steps (messages/profile_calls.py)
    async def start_profile(
        self, *, record_shapes: bool = False, with_stack: bool = False
    ) -> ProfileReply: ...

    async def stop_profile(self) -> ProfileReply: ...
