"""thinking_token_budget over HTTP (vLLM's field; Anthropic's thinking.budget_tokens): a server
with `--reasoning-parser deepseek_r1` (its answers start thinking; the template opens it too:
`<think>` ends the prompt), on the fake runner, whose tokens never close it. Without a budget
the whole answer is thinking; with one, the parser's `</think>` is forced after that many
tokens, so the answer splits there: that many tokens of reasoning, then content. A budget on a
server without a parser with tags is a 400 naming it; Anthropic's budget_tokens is accepted
there, as before."""

from __future__ import annotations

from typing import Any

import pytest
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, post_json, scripted_server
from tests.gateway.scripted_runner import template_model

TEMPLATE = """\
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}<|im_start|>assistant
<think>
"""
QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module", params=["deepseek_r1", None])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = template_model(tmp_path_factory.mktemp("thinking-model"), TEMPLATE)
    started = scripted_server(folder, GatewaySettings(reasoning_parser=request.param)).start()
    yield request.param, started
    started.shutdown()


def _chat(srv: ServerThread, **extra: Any) -> tuple[int, Any]:
    body = {"model": "", "messages": QUESTION, "max_tokens": 12, **extra}
    return post_json(srv.url, "/v1/chat/completions", body)


def test_the_budget_closes_thinking(server: tuple[str | None, ServerThread]) -> None:
    parser, srv = server
    if parser is None:
        status, answer = _chat(srv, thinking_token_budget=4)
        assert status == 400 and answer["error"]["param"] == "thinking_token_budget", answer
        assert "--reasoning-parser" in answer["error"]["message"]
        return
    status, free = _chat(srv, return_token_ids=True)
    assert status == 200, free
    message = free["choices"][0]["message"]
    assert message["content"] is None and message["reasoning_content"]  # all thinking
    tokenizer = srv.engine.tokenizer
    close = tokenizer.encode("</think>", False)
    for budget in (4, 0):
        status, answer = _chat(srv, thinking_token_budget=budget, return_token_ids=True)
        assert status == 200, answer
        ids = answer["choices"][0]["token_ids"]
        assert ids[budget : budget + len(close)] == close, (budget, ids)
        message = answer["choices"][0]["message"]
        assert message["content"], message  # what follows the tag is the answer
        thought = message["reasoning_content"] or ""
        assert thought.strip() == tokenizer.decode(ids[:budget]).strip()


def test_anthropic_budget_tokens(server: tuple[str | None, ServerThread]) -> None:
    parser, srv = server
    body: dict[str, Any] = {
        "model": "",
        "max_tokens": 12,
        "messages": QUESTION,
        "thinking": {"type": "enabled", "budget_tokens": 3},
    }
    status, answer = post_json(srv.url, "/v1/messages", body)
    assert status == 200, answer
    kinds = [block["type"] for block in answer["content"]]
    if parser is None:  # accepted, not enforced: no parser splits anything
        assert kinds == ["text"]
        return
    assert kinds == ["thinking", "text"], answer  # closed after 3 tokens, then the answer
    status, bad = post_json(
        srv.url, "/v1/messages", {**body, "thinking": {"type": "enabled", "budget_tokens": -1}}
    )
    assert status == 400 and bad["error"]["message"].startswith("thinking.budget_tokens"), bad
