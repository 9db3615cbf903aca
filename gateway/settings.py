"""The gateway's knobs (the engine's are in EngineConfig), checked on construction.

`troupe serve` has one kebab-case flag per field (`--allowed-origins`, `--header-timeout`),
generated from this dataclass by `add_settings_arguments`, with each field's `help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
import urllib.parse
from collections.abc import Collection
from typing import Any

from troupe.config import ConfigError
from troupe.gateway.reasoning import PARSERS, ParserName
from troupe.gateway.tls import check_tls
from troupe.gateway.tool_auto import TOOL_PARSERS, ToolParserName, auto_tool_parser
from troupe.messages.pooling import PoolingType


def _knob(default: Any, help: str, metavar: str | None = None) -> Any:
    metadata = {"help": help, "metavar": metavar or ""}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """How the HTTP and websocket server treats its clients."""

    api_key: str | None = _knob(
        None,
        "require 'Authorization: Bearer KEY' on /v1/* (the websocket also takes ?api_key=); "
        "/, /health and /metrics stay open",
    )
    allowed_origins: tuple[str, ...] = _knob(
        (),
        "web origins (scheme://host[:port]) besides this server's own whose pages may call "
        "/v1/* (CORS and the websocket); '*' allows any page anywhere",
        "ORIGIN",
    )
    served_model_name: tuple[str, ...] = _knob(
        (),
        "the names a request's model may give the model (vLLM's flag); the first is its id in "
        "answers, GET /v1/models' parent of each LoRA adapter, /health and /metrics' model_name; "
        "unset: the model's file or folder name",
        "NAME",
    )
    return_tokens_as_token_ids: bool = _knob(
        False,
        "completions and chat: logprobs name each token 'token_id:{id}' instead of its text "
        "(vLLM's flag), for tokens that do not decode to text alone; a request's "
        "return_tokens_as_token_ids overrides it",
    )
    enable_force_include_usage: bool = _knob(
        False,
        "completions and chat: every streamed answer ends with a usage chunk, as if it asked "
        "stream_options.include_usage (vLLM's flag)",
    )
    enable_request_id_headers: bool = _knob(
        False,
        "every HTTP answer carries an X-Request-Id header (vLLM's flag): the one its request "
        "sent, else a fresh random one; websocket upgrades are left alone",
    )
    incremental_streaming_output: bool = _knob(
        False,
        "SGLang's /generate streams: each chunk carries only its own new text, output_ids and "
        "logprob rows (SGLang's flag); off: everything so far, SGLang's default",
    )
    max_body_bytes: int = _knob(4 * 1024 * 1024, "request bodies above this get 413")
    media_fetch_timeout: float = _knob(
        5.0,
        "seconds an http(s) image URL of a chat message has to arrive whole (vLLM's "
        "VLLM_IMAGE_FETCH_TIMEOUT); after it a 400 names the part",
    )
    max_media_bytes: int = _knob(
        20 * 1024 * 1024, "the largest image an http(s) image URL may give (a 400 names the part)"
    )
    allowed_media_domains: tuple[str, ...] = _knob(
        (),
        "the hosts http(s) image URLs may name (vLLM's flag); none given: any host",
        "HOST",
    )
    body_timeout: float = _knob(30.0, "seconds a client has to send a request body (408 after)")
    header_timeout: float = _knob(
        15.0, "seconds a new connection has to send its first complete request head"
    )
    keepalive_timeout: float = _knob(
        75.0,
        "seconds a kept-alive connection may wait for (or trickle) its next request head; "
        "keep it above a reverse proxy's own idle timeout",
    )
    max_connections: int = _knob(
        1024, "open client connections; one more gets 503 and is closed at once"
    )
    max_buffered_frames: int = _knob(
        2048, "per connection: unread frames before a reader is cut off"
    )
    max_buffered_bytes: int = _knob(8 * 1024 * 1024, "per connection: unread bytes, same")
    slow_client_grace: float = _knob(
        5.0, "seconds a cut-off client gets to take its error before it is dropped"
    )
    ws_max_requests: int = _knob(256, "requests in flight on one websocket")
    max_prompts_per_request: int = _knob(
        256,
        "completions: prompts one request may list (each runs as an engine request of its own, "
        "times n); more get 400",
    )
    pooling_type: PoolingType = _knob(  # noqa: RUF009 (a Literal of str: immutable)
        "last",
        "/v1/embeddings: how a prompt's final hidden states pool into its vector (vLLM's "
        "pooler_config pooling_type): last (decoder embedding models such as "
        "Qwen3-Embedding), mean, or cls (the first token)",
    )
    max_embedding_inputs: int = _knob(
        2048,
        "/v1/embeddings: inputs one request may list (each runs as an engine request of its "
        "own; OpenAI's limit), and /v1/score and /v1/rerank: texts one request may name; "
        "more get 400",
    )
    reasoning_parser: ParserName | None = _knob(  # noqa: RUF009 (None or a str: immutable)
        None,
        "chat: split a reasoning model's <think>...</think> out of the answer into "
        "reasoning_content (vLLM's and SGLang's flag): deepseek_r1 (answers start thinking), "
        "qwen3 (answers think when they or the prompt open <think>), deepseek_v3 (V3.1: "
        "thinks when the prompt opens <think>), mistral ([THINK]...[/THINK]), granite "
        '("Here is my thought process:" ... "Here is my response:"), glm45 (GLM-4.5: as '
        "qwen3), minimax_m2 (as deepseek_r1), seed_oss (<seed:think>...</seed:think>), "
        "hunyuan_a13b (as qwen3, the answer's <answer> tags removed), ernie45 (as deepseek_r1, "
        "the answer's <response> tags removed), exaone4 (as deepseek_v3), apertus (<|inner_prefix|>...<|inner_suffix|>), olmo3 (as qwen3), openai_gptoss (GPT-OSS's harmony channels: analysis is the reasoning)",
    )
    tool_call_parser: ToolParserName | None = _knob(  # noqa: RUF009 (None or a str: immutable)
        None,
        'chat: the tool-call format tool_choice "auto" replies are parsed in, whatever the chat '
        "template (vLLM's flag): hermes (<tool_call> tags), llama3_json (Llama 3.x's JSON "
        "calls), mistral ([TOOL_CALLS]), pythonic (Llama 3.2/4's [f(a=1)]), qwen3_coder "
        "(<function=...> XML), deepseek_v3 (<｜tool▁calls▁begin｜>), deepseek_v31 (V3.1's "
        "unfenced calls), granite "
        "(<|tool_call|>[...]), kimi_k2 (<|tool_calls_section_begin|>), glm45 (<arg_key> "
        "pairs), minimax_m2 (<minimax:tool_call>), seed_oss (qwen3_coder's in "
        "<seed:tool_call>), hunyuan_a13b (<tool_calls>[...]), openai (GPT-OSS's calls to functions.*; needs reasoning_parser "
        "openai_gptoss); unset: the one the chat template writes (hermes, qwen3_coder, glm45, "
        "kimi_k2, minimax_m2, seed_oss, hunyuan_a13b, or openai with that reasoning "
        'parser), else "auto" is refused',
    )
    enable_auto_tool_choice: bool = _knob(
        True,
        'chat: tool_choice "auto" (the default when tools are sent) is read in the format '
        "above; --no-enable-auto-tool-choice refuses it (400), as vLLM does without its "
        "--enable-auto-tool-choice, which troupe takes as on",
    )
    max_stored_responses: int = _knob(
        0,
        "/v1/responses: keep up to this many answers (store: true, OpenAI's default) in this "
        "process's memory, the oldest evicted first, for previous_response_id and GET/DELETE "
        "/v1/responses/{id} (and its /input_items); 0 stores none and ignores store, as vLLM "
        "does without VLLM_ENABLE_RESPONSES_API_STORE",
    )
    max_stored_response_bytes: int = _knob(
        64 * 1024 * 1024,
        "with --max-stored-responses: the stored answers' JSON (each with its whole "
        "conversation) in bytes, the oldest evicted first; an answer larger alone is not kept",
    )
    ws_heartbeat: float | None = _knob(
        30.0, "seconds between websocket pings; a dead peer is noticed and its requests aborted"
    )
    allow_runtime_lora_updating: bool = _knob(
        False,
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING): clients behind the API key may then make the "
        "engine read adapter folders of this machine by path; the engine needs enable_lora "
        "(or lora_modules); off: both paths are 404",
    )
    allow_runtime_weight_updating: bool = _knob(
        False,
        "serve POST /update_weights_from_disk (SGLang's): clients behind the API key may then "
        "make the engine read a checkpoint folder of this machine by path and replace the "
        "served weights in place; off: the path is 404",
    )
    ssl_keyfile: str | None = _knob(
        None, "serve HTTPS: the server's private key (PEM), with ssl_certfile (vLLM's flag)"
    )
    ssl_certfile: str | None = _knob(
        None, "serve HTTPS: the server's certificate chain (PEM), with ssl_keyfile (vLLM's flag)"
    )
    ssl_ca_certs: str | None = _knob(
        None, "the CA certificates (PEM) that sign the client certificates ssl_cert_reqs asks for"
    )
    ssl_cert_reqs: int = _knob(
        0, "client certificates: 0 not asked, 1 checked if sent, 2 required (mutual TLS)"
    )
    engine_process: bool = _knob(
        True,
        "run the engine (its actors and the model runner) in a child process, so that HTTP "
        "work never holds the engine's interpreter lock; --no-engine-process runs it inside "
        "the server's own process",
    )

    def auto_tool_parser(self, template: str | None) -> ToolParserName | None:
        """The format tool_choice "auto" replies are read in for a model whose chat template is
        `template` (None: "auto" is refused): tool_auto.auto_tool_parser, when enabled."""
        if not self.enable_auto_tool_choice:
            return None
        return auto_tool_parser(self.tool_call_parser, self.reasoning_parser, template)

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_connections",
            "max_buffered_frames",
            "max_buffered_bytes",
            "ws_max_requests",
            "max_prompts_per_request",
            "max_embedding_inputs",
            "max_stored_response_bytes",
            "max_media_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_stored_responses < 0:
            raise ConfigError(
                f"max_stored_responses must be >= 0 (0: none), got {self.max_stored_responses}"
            )
        timeouts = ("body_timeout", "header_timeout", "keepalive_timeout", "slow_client_grace")
        for name in (*timeouts, "media_fetch_timeout", "ws_heartbeat"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value}")
        if self.pooling_type not in typing.get_args(PoolingType):
            choices = ", ".join(typing.get_args(PoolingType))
            raise ConfigError(f"pooling_type must be one of {choices}, got {self.pooling_type!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in PARSERS:
            choices = ", ".join(PARSERS)
            raise ConfigError(
                f"reasoning_parser must be one of {choices}, got {self.reasoning_parser!r}"
            )
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            choices = ", ".join(TOOL_PARSERS)
            raise ConfigError(
                f"tool_call_parser must be one of {choices}, got {self.tool_call_parser!r}"
            )
        if self.tool_call_parser == "openai" and self.reasoning_parser != "openai_gptoss":
            raise ConfigError(
                "tool_call_parser openai reads GPT-OSS's harmony answers: it needs "
                f"reasoning_parser openai_gptoss, got {self.reasoning_parser!r}"
            )
        check_tls(self)
        for name in (
            "engine_process",
            "allow_runtime_lora_updating",
            "allow_runtime_weight_updating",
            "return_tokens_as_token_ids",
            "enable_request_id_headers",
            "enable_force_include_usage",
            "enable_auto_tool_choice",
            "incremental_streaming_output",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key must be non-empty when set")
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        object.__setattr__(self, "served_model_name", tuple(self.served_model_name))
        _check_served_names(self.served_model_name)
        for origin in self.allowed_origins:
            if origin != "*" and canonical_origin(origin) is None:
                raise ConfigError(
                    f"allowed_origins: {origin!r} is not '*' or an origin such as "
                    "'https://example.com' or 'http://localhost:3000' (no path)"
                )

    def replace(self, **changes: Any) -> GatewaySettings:
        return dataclasses.replace(self, **changes)


def _check_served_names(names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(
                f"served_model_name: each name must be a non-empty string, got {name!r}"
            )
        if names.count(name) > 1:
            raise ConfigError(f"served_model_name lists {name!r} twice")


def canonical_origin(origin: str) -> str | None:
    """`scheme://host:port`, lowercased, with the scheme's default port made explicit; None if
    `origin` is not a plain http(s) origin (a path, a query, 'null')."""
    try:
        url = urllib.parse.urlsplit(origin)
        port = url.port
    except ValueError:
        return None
    if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/"):
        return None
    if url.query or url.fragment or url.username is not None:
        return None
    if port is None:
        port = 443 if url.scheme == "https" else 80
    return f"{url.scheme}://{url.hostname}:{port}"


def add_settings_arguments(
    parser: argparse.ArgumentParser, names: Collection[str] | None = None
) -> None:
    """One flag per GatewaySettings field (`names`: these fields only), typed from its
    annotation."""
    hints = typing.get_type_hints(GatewaySettings)
    group = parser.add_argument_group("gateway")
    for f in dataclasses.fields(GatewaySettings):
        if names is not None and f.name not in names:
            continue
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        help_text = f"{f.metadata['help']} (default: {f.default!r})"
        if typing.get_origin(hint) is tuple:
            metavar = f.metadata["metavar"]
            group.add_argument(flag, nargs="*", default=f.default, metavar=metavar, help=help_text)
        elif typing.get_origin(hint) is typing.Literal:
            choices = typing.get_args(hint)
            group.add_argument(flag, choices=choices, default=f.default, help=help_text)
        elif hint is bool:
            action = argparse.BooleanOptionalAction
            group.add_argument(flag, action=action, default=f.default, help=help_text)
        else:
            group.add_argument(
                flag, type=hint, default=f.default, metavar=f.name.upper(), help=help_text
            )


def settings_from_args(ns: argparse.Namespace) -> GatewaySettings:
    """Settings from parsed flags; a field without its flag keeps its default."""
    fields = dataclasses.fields(GatewaySettings)
    values: dict[str, Any] = {f.name: getattr(ns, f.name, f.default) for f in fields}
    for name in ("allowed_origins", "served_model_name"):
        values[name] = tuple(values[name] or ())
    return GatewaySettings(**values)
