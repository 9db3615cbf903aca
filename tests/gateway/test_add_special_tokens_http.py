"""vLLM's add_special_tokens over HTTP, on a tokenizer that adds a BOS (SmolLM2's, given a
post-processor; a fake runner): completions' text gets it unless the body says false, chat's
rendered messages get none unless it says true; the ids the engine ran (return_token_ids),
/tokenize's and a beam search's prompt agree."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, scripted_server
from tests.gateway.scripted_runner import say, template_model

TEMPLATE = """\
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
BOS = 1  # <|im_start|>, which the post-processor puts first
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def bos_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = template_model(tmp_path_factory.mktemp("bos-model"), TEMPLATE)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [BOS], "tokens": ["<|im_start|>"]}},
    }  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    srv = scripted_server(Path(folder), GatewaySettings()).start()
    say(srv, "ok")
    yield srv
    srv.shutdown()


def _post(server: ServerThread, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:  # an error status raises
        answer: dict[str, Any] = json.load(resp)
    return answer


def _ran(server: ServerThread, path: str, body: dict[str, Any]) -> list[int]:
    """The prompt ids the engine ran for `body` (vLLM's return_token_ids)."""
    answer = _post(server, path, {**body, "max_tokens": 2, "return_token_ids": True})
    if path == "/v1/completions":
        ids: list[int] = answer["choices"][0]["prompt_token_ids"]
    else:
        ids = answer["prompt_token_ids"]
    return ids


def test_completions_text_gets_the_bos_unless_told_not_to(bos_server: ServerThread) -> None:
    plain = load_tokenizer().encode("Hello world", False)
    body = {"prompt": "Hello world"}
    assert _ran(bos_server, "/v1/completions", body) == [BOS, *plain]
    assert _ran(bos_server, "/v1/completions", {**body, "add_special_tokens": True}) == [
        BOS,
        *plain,
    ]
    off = {**body, "add_special_tokens": False}
    assert _ran(bos_server, "/v1/completions", off) == plain
    assert _post(bos_server, "/tokenize", off)["tokens"] == plain
    beam = _post(bos_server, "/v1/completions", {**off, "use_beam_search": True, "n": 2})
    assert beam["usage"]["prompt_tokens"] == len(plain)
    beam = _post(bos_server, "/v1/completions", {**body, "use_beam_search": True, "n": 2})
    assert beam["usage"]["prompt_tokens"] == len(plain) + 1


def test_chat_gets_no_second_bos_unless_told_to(bos_server: ServerThread) -> None:
    chat = _ran(bos_server, "/v1/chat/completions", {"messages": MESSAGES})
    assert chat[0] == BOS and chat[1] != BOS  # the template's own, once
    assert _post(bos_server, "/tokenize", {"messages": MESSAGES})["tokens"] == chat
    on = {"messages": MESSAGES, "add_special_tokens": True}
    assert _ran(bos_server, "/v1/chat/completions", on) == [BOS, *chat]
    assert _post(bos_server, "/tokenize", on)["tokens"] == [BOS, *chat]
