"""vLLM's --default-chat-template-kwargs (EngineConfig.default_chat_template_kwargs): the
template's variables where a request leaves them out, in the prompt the engine runs (its
tokenizer in the engine process) and in what /tokenize and /v1/messages/count_tokens render
(the server's own tokenizer); a request's chat_template_kwargs win; a value that is not a JSON
object is refused naming the knob, on the command line too."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.config import ConfigError, EngineConfig
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.scripted_runner import template_model

TEMPLATE = """\
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{%- if greeting is defined %} {{ greeting }}{% endif %}
{% endif %}"""
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = template_model(tmp_path_factory.mktemp("defaults-model"), TEMPLATE)
    config = BASE_CONFIG.replace(
        model=str(folder), default_chat_template_kwargs={"greeting": "Ahoy there matey"}
    )
    server = ServerThread(config, GatewaySettings())
    yield server.start()
    server.shutdown()


def _post(url: str, body: Any) -> Any:
    headers = {"Content-Type": "application/json"}
    with urllib.request.urlopen(
        urllib.request.Request(url, json.dumps(body).encode(), headers)
    ) as r:
        return json.loads(r.read())


def _ids(srv: ServerThread, **kwargs: Any) -> list[int]:
    from troupe.actors.core.tokenizer_files import load_tokenizer

    tokenizer = load_tokenizer(Path(srv.config.model or ""))  # the model's, no defaults
    return tokenizer.encode(tokenizer.render_chat(HI, **kwargs), False)


def test_the_defaults_reach_every_rendering(srv: ServerThread) -> None:
    with_default = _ids(srv, greeting="Ahoy there matey")
    assert with_default != _ids(srv)  # the variable changes the prompt
    chat = {"messages": HI, "max_tokens": 2, "return_token_ids": True}
    ran = _post(f"{srv.url}/v1/chat/completions", chat)
    assert ran["prompt_token_ids"] == with_default  # the engine's tokenizer
    tokenized = _post(f"{srv.url}/tokenize", {"messages": HI})
    assert tokenized["tokens"] == with_default  # the server's
    counted = _post(f"{srv.url}/v1/messages/count_tokens", {"model": "", "messages": HI})
    assert counted["input_tokens"] == len(with_default)


def test_a_requests_kwargs_win(srv: ServerThread) -> None:
    own = {"chat_template_kwargs": {"greeting": "Hello"}}
    ran = _post(
        f"{srv.url}/v1/chat/completions",
        {"messages": HI, "max_tokens": 2, "return_token_ids": True, **own},
    )
    assert ran["prompt_token_ids"] == _ids(srv, greeting="Hello")
    assert _post(f"{srv.url}/tokenize", {"messages": HI, **own})["tokens"] == _ids(
        srv, greeting="Hello"
    )


@pytest.mark.parametrize("bad", [["x"], {1: 2}, {"x": object()}])
def test_a_value_not_a_json_object_is_named(bad: Any) -> None:
    with pytest.raises(ConfigError, match="default_chat_template_kwargs"):
        EngineConfig(runner="fake", default_chat_template_kwargs=bad)


def test_the_flag_takes_json() -> None:
    import argparse

    from troupe.ops.cli import add_config_arguments

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--default-chat-template-kwargs", '{"enable_thinking": false}'])
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
