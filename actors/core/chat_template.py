"""Chat templates: render a conversation into prompt text the way HF `apply_chat_template` does.

Templates come from model files, so they are untrusted code: they run in jinja2's immutable
sandbox. The environment mirrors transformers' (trim_blocks, lstrip_blocks, loop controls, a
`tojson` that does not HTML-escape, `raise_exception`, `strftime_now`, and a pass-through
`{% generation %}` tag) so that the same template gives the same text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The model has no chat template, the template is broken, or it rejected the messages."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in HF;
    for rendering it is a no-op, but templates that use it must still parse."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's own class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's built-in tojson HTML-escapes '<' and '&', which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class ChatTemplate:
    """A compiled chat template. `render()` is safe to call from any thread."""

    def __init__(
        self,
        source: str,
        *,
        special_tokens: Mapping[str, str | None] | None = None,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        """`special_tokens` (bos_token, eos_token, ...) become template variables, as in HF.
        `now` backs `strftime_now`; pass a fixed clock where output must be reproducible."""
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols, _GenerationTag],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"the chat template does not parse: {exc}") from exc
        self._special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages` (dicts as vLLM hands them to transformers: role,
        content, tool calls with parsed arguments; `chat_messages.template_messages` builds them).
        `continue_final_message`: cut the text right after the last message's content, so the
        model continues it (HF's rule; needs add_generation_prompt false). `extra` passes
        further template variables (tools, documents, enable_thinking, ...)."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be set"
            )
        variables: dict[str, Any] = {"tools": None, "documents": None, **self._special_tokens}
        variables.update(extra)
        variables.update(messages=[dict(m) for m in messages])
        variables.update(add_generation_prompt=add_generation_prompt)
        try:
            text: str = self._template.render(**variables)
        except Exception as exc:  # the template is foreign code: any failure is its verdict
            raise ChatTemplateError(f"the chat template rejected the messages: {exc}") from exc
        if continue_final_message and messages:
            text = _open_ended(text, str(messages[-1].get("content", "")))
        return text


def _open_ended(text: str, final: str) -> str:
    """`text` cut after the last occurrence of the final message's content (stripped, if the
    template stripped it), so nothing the template wrote after it (an end-of-turn token)
    remains."""
    for content in (final, final.strip()):
        if content and (at := text.rfind(content)) >= 0:
            return text[: at + len(content)]
    raise ChatTemplateError(
        "continue_final_message is set but the final message's content does not appear in the "
        "rendered chat"
    )
