"""Earlier GPT-OSS turns as its chat template can take them back (`--reasoning-parser
openai_gptoss`).

A harmony answer that calls a tool may say three things: its thinking (analysis channel), a
preamble to the user (commentary without a recipient) and the calls. The server returns them
as `reasoning_content`, `content` and `tool_calls` (gateway/harmony.py), and a client sends
the turn back whole. GPT-OSS's template renders a call turn's analysis from its `content` or
its `thinking` (the reasoning, actors/core/chat_messages.py) and refuses a turn with both
("Cannot pass both content and thinking"). vLLM renders such a turn as a commentary message
and an analysis message; here the preamble joins the thinking after it, in the order the model
wrote them, so the turn renders and nothing the model wrote is lost.

    {"content": "Checking.", "reasoning": "Need weather.", "tool_calls": [...]}
        ->  {"reasoning": "Need weather.\\n\\nChecking.", "tool_calls": [...]}

The template keeps a call turn's thinking until a later answer (its final channel), as vLLM
keeps analysis messages after the last final one; the other turns' thinking it drops.
"""

from __future__ import annotations

import msgspec
from troupe.messages import ChatMessage, ChatPrompt


def harmony_turns(prompt: list[ChatMessage] | ChatPrompt) -> list[ChatMessage] | ChatPrompt:
    """`prompt` with each call turn's preamble joined to its thinking (the module's rule)."""
    if isinstance(prompt, ChatPrompt):
        return msgspec.structs.replace(prompt, messages=tuple(_turns(prompt.messages)))
    return _turns(prompt)


def _turns(messages: list[ChatMessage] | tuple[ChatMessage, ...]) -> list[ChatMessage]:
    out = []
    for message in messages:
        if message.tool_calls and message.content and message.reasoning:
            joined = f"{message.reasoning}\n\n{message.content}"
            message = msgspec.structs.replace(message, content=None, reasoning=joined)
        out.append(message)
    return out
