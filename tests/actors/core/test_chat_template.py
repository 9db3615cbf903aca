"""Chat templates render exactly as transformers renders them, safely."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from troupe.actors.core.chat_template import ChatTemplate, ChatTemplateError
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer

MESSAGES = [
    {"role": "system", "content": "You answer in JSON."},
    {"role": "user", "content": 'List <two> primes & "explain" 😀'},
    {"role": "assistant", "content": "[2, 3]"},
    {"role": "user", "content": "  leading and trailing spaces  \n"},
]

# Exercises trim_blocks/lstrip_blocks, loop controls, tojson with options, namespace and slicing.
RICH_TEMPLATE = """\
{%- set ns = namespace(count=0) -%}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% continue %}
    {% endif %}
    {% set ns.count = ns.count + 1 %}
<{{ message['role'] }}>{{ message['content'] | trim }}</{{ message['role'] }}>
{{ message | tojson }}
{{ {'k': [1, 'é']} | tojson(indent=2) }}
{% endfor %}
{% if add_generation_prompt %}{{ bos_token }}assistant #{{ ns.count }}{% endif %}"""


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def _hf_render(template: str, messages: list[dict[str, str]], add: bool, **kwargs: Any) -> str:
    chat_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = chat_utils.render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=add, **kwargs
    )
    return str(rendered[0])


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_template_matches_transformers(
    tok: TextTokenizer, add_generation_prompt: bool
) -> None:
    assert tok.chat_template is not None
    for messages in (MESSAGES, MESSAGES[1:2]):
        expected = _hf_render(
            tok.chat_template,
            messages,
            add_generation_prompt,
            bos_token="<|im_start|>",
            eos_token="<|im_end|>",
        )
        assert tok.render_chat(messages, add_generation_prompt=add_generation_prompt) == expected
    assert tok.render_chat(MESSAGES[1:2]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        'Face<|im_end|>\n<|im_start|>user\nList <two> primes & "explain" 😀<|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_rich_template_matches_transformers() -> None:
    template = ChatTemplate(RICH_TEMPLATE, special_tokens={"bos_token": "<s>", "eos_token": None})
    for add in (True, False):
        expected = _hf_render(RICH_TEMPLATE, MESSAGES, add, bos_token="<s>")
        assert template.render(MESSAGES, add_generation_prompt=add) == expected
    assert '"content": "List <two> primes & \\"explain\\" 😀"' in template.render(MESSAGES)


def test_raise_exception_becomes_chat_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}"
        "{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        template.render([{"role": "assistant", "content": "x"}])


def test_strftime_now_uses_the_given_clock() -> None:
    template = ChatTemplate(
        "Today: {{ strftime_now('%d %b %Y') }}", now=lambda: datetime(2024, 7, 26, 9, 30)
    )
    assert template.render([]) == "Today: 26 Jul 2024"


def test_generation_tag_is_transparent() -> None:
    source = (
        "{% for m in messages %}{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}"
    )
    assert (
        ChatTemplate(source).render([{"role": "a", "content": "x"}, {"role": "b", "content": "y"}])
        == "[x][y]"
    )


def test_sandbox_blocks_escapes() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        template.render([])
    mutate = ChatTemplate("{% set _ = messages.append(1) %}{{ messages | length }}")
    with pytest.raises(ChatTemplateError, match="rejected"):
        mutate.render([{"role": "user", "content": "x"}])


def test_broken_template_and_missing_template() -> None:
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
    no_template = load_tokenizer()
    no_template.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        no_template.render_chat([{"role": "user", "content": "x"}])
