"""`troupe serve --reasoning-parser openai_gptoss` over HTTP with the official `openai` client:
a scripted runner says a harmony answer (GPT-OSS's channel markers are special tokens of its
tokenizer), whole and streamed; the analysis channel comes back as `reasoning_content`, the
final channel as `content`, no marker in either (the request ran with its special tokens
kept, the parser dropped them, and the EOS that ended the answer is not text, as in vLLM)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from troupe.gateway.harmony import MARKERS
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, scripted_server

TEMPLATE = """\
{%- for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""
REPLY = (
    "<|channel|>analysis<|message|>The user greets. Reply politely.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """SmolLM2's tokenizer with harmony's markers added as special tokens."""
    from troupe.actors.core.tokenizer_files import load_tokenizer

    folder = tmp_path_factory.mktemp("harmony-model")
    tokenizer = load_tokenizer().tokenizer
    tokenizer.add_special_tokens(list(MARKERS))
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    started = scripted_server(folder, GatewaySettings(reasoning_parser="openai_gptoss")).start()
    yield started
    started.shutdown()


def _say(server: ServerThread, text: str) -> None:
    tokenizer = server.engine.tokenizer
    ids = tokenizer.encode(text, False)
    assert tokenizer.decode(ids, False) == text
    assert tokenizer.decode(ids) != text  # the markers are special: skipped by default
    server.runner.script = (*ids, *tokenizer.eos_token_ids[:1])


def test_analysis_is_reasoning_and_final_is_content(server: ServerThread) -> None:
    _say(server, REPLY)
    client = openai_client(server.url)
    body: dict[str, Any] = {
        "model": server.engine.model_name,
        "messages": [{"role": "user", "content": "Hi there"}],
        "max_tokens": 64,
    }
    whole = client.chat.completions.create(**body).choices[0].message
    expected = ("The user greets. Reply politely.", "Hello! How can I help?")
    assert ((whole.model_extra or {}).get("reasoning_content"), whole.content) == expected
    reasoning: list[str] = []
    content: list[str] = []
    for chunk in client.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert ("".join(reasoning), "".join(content)) == expected
