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


@pytest.mark.parametrize("final", ["[2, 3", "  an open answer, spaced  \n"])
def test_continue_final_message_matches_transformers(tok: TextTokenizer, final: str) -> None:
    """The text ends right after the last message's content (stripped when the template
    strips it), as transformers cuts it: no end-of-turn, no generation prompt."""
    assert tok.chat_template is not None
    open_turn = [MESSAGES[1], {"role": "assistant", "content": final}]
    expected = _hf_render(
        tok.chat_template,
        open_turn,
        False,
        continue_final_message=True,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    got = tok.render_chat(open_turn, add_generation_prompt=False, continue_final_message=True)
    assert got == expected
    assert got.endswith(final) and "<|im_end|>" not in got.split("assistant\n")[-1]
    with pytest.raises(ChatTemplateError, match="cannot both be set"):
        tok.render_chat(open_turn, add_generation_prompt=True, continue_final_message=True)


def test_continue_final_message_needs_the_content_in_the_text() -> None:
    template = ChatTemplate("{% for m in messages %}<{{ m['role'] }}>{% endfor %}")
    with pytest.raises(ChatTemplateError, match="does not appear"):
        template.render(MESSAGES[:2], add_generation_prompt=False, continue_final_message=True)


def test_template_kwargs_reach_the_template() -> None:
    """chat_template_kwargs (enable_thinking, as Qwen3's template reads it) are variables."""
    source = (
        "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
        "{{ messages[-1]['content'] }}"
    )
    template = ChatTemplate(source)
    assert template.render(MESSAGES[1:2], enable_thinking=False).startswith("/no_think List")
    assert template.render(MESSAGES[1:2]).startswith("List")


def test_engine_config_chat_template_replaces_the_models(tmp_path: Any) -> None:
    """EngineConfig.chat_template (vLLM's --chat-template): a .jinja file or the text itself;
    anything else names the knob."""
    from troupe.actors.core.tokenizer_files import (
        TokenizerLoadError,
        chat_template_text,
        load_tokenizer,
    )

    text = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    file = tmp_path / "t.jinja"
    file.write_text(text)
    assert chat_template_text(str(file)) == text == chat_template_text(text)
    with pytest.raises(TokenizerLoadError, match="chat_template: 'chatml' is neither"):
        chat_template_text("chatml")
    tok = load_tokenizer(None, str(file))
    assert tok.render_chat(MESSAGES[1:2]) == '[user] List <two> primes & "explain" 😀\n'
    assert load_tokenizer(None).render_chat(MESSAGES[1:2]).startswith("<|im_start|>system")
