"""The server's reasoning parser on one chat-shaped request (chat completions, responses and
messages): the splitter its answer runs through, its structured output's constraint moved past
the thinking (gateway/reasoning.py says how each parser reads a prompt and an answer), and its
earlier turns as the parser's template takes them back (gateway/harmony_turns.py)."""

from __future__ import annotations

from typing import NamedTuple

import msgspec
from troupe.gateway.engine_api import TokenizerLike
from troupe.gateway.errors import invalid
from troupe.gateway.harmony_turns import harmony_turns
from troupe.gateway.reasoning import (
    PROMPT_DECIDES,
    STARTS_THINKING,
    TAGS,
    ParserName,
    ReasoningSplitter,
    constraint_reasoning,
)
from troupe.gateway.tokenize_routes import render_chat
from troupe.gateway.tool_calls import ToolPlan
from troupe.messages import ChatMessage, ChatPrompt, SamplingParams

Prompt = list[ChatMessage] | ChatPrompt


class ChatReasoning(NamedTuple):
    """What the parser makes of a request: `splitter` for its answer, the `params` and
    `prompt` to run."""

    splitter: ReasoningSplitter | None
    params: SamplingParams
    prompt: Prompt


def chat_reasoning(
    parser: ParserName | None,
    tokenizer: TokenizerLike,
    prompt: Prompt,
    params: SamplingParams,
    tools: ToolPlan | None = None,
) -> ChatReasoning:
    """The splitter, params and prompt for a chat `prompt` (plain messages or a ChatPrompt)
    calling `tools` (the request's plan); no parser: (None, params, prompt)."""
    params = with_thinking_tags(parser, params)
    if parser is None:
        return ChatReasoning(None, params, prompt)
    prompt_text = ""  # qwen3, deepseek_v3: whether the answer starts thinking is the prompt's
    spec = params.structured_outputs
    if parser in PROMPT_DECIDES and (isinstance(prompt, ChatPrompt) or spec is not None):
        prompt_text = render_chat(tokenizer, chat_of(prompt))
    # GPT-OSS's "auto" calls stay in the content for the `openai` tool parser (gateway/harmony.py)
    keeps_calls = tools is not None and tools.spec is None and tools.parser == "openai"
    splitter = ReasoningSplitter(parser, prompt_text, keeps_calls=keeps_calls)
    tags = TAGS.get(parser)
    if parser == "openai_gptoss" or (tags is not None and tags.special):
        # the markers are special tokens (GPT-OSS's channels: gateway/harmony.py)
        params = msgspec.structs.replace(params, skip_special_tokens=False)
    if parser == "openai_gptoss":
        prompt = harmony_turns(prompt)
    if spec is not None:  # the constraint (tool calls' too) starts after the thinking
        spec = msgspec.structs.replace(spec, reasoning=constraint_reasoning(parser, prompt_text))
        params = msgspec.structs.replace(params, structured_outputs=spec)
    return ChatReasoning(splitter, params, prompt)


def chat_of(prompt: object) -> ChatPrompt:
    """A chat request's prompt as a ChatPrompt (plain messages: the template's defaults)."""
    if isinstance(prompt, ChatPrompt):
        return prompt
    assert isinstance(prompt, list), "a chat request's prompt is its messages"
    return ChatPrompt(messages=tuple(prompt))


def with_thinking_tags(
    parser: ParserName | None, params: SamplingParams, *, required: bool = True
) -> SamplingParams:
    """`params` with the parser's tags where it asks for a thinking_token_budget (its first
    opening and closing tag: the executor forces the closing one past the budget). Where the
    server's parser has no tags: a 400 naming the budget, or, not `required` (Anthropic's
    budget_tokens, which clients send to any server), the budget dropped."""
    if params.thinking_token_budget is None or params.thinking_tags is not None:
        return params
    tags = None if parser is None else TAGS.get(parser)
    if tags is None and not required:
        return msgspec.structs.replace(params, thinking_token_budget=None)
    if tags is None:
        served = ", ".join(TAGS)
        raise invalid(
            "thinking_token_budget",
            f"thinking_token_budget needs the server's --reasoning-parser to be one with "
            f"thinking tags ({served}); this server's is {parser or 'not set'}",
        )
    pair = (tags.starts[0], tags.ends[0])
    start_open = parser in STARTS_THINKING
    return msgspec.structs.replace(params, thinking_tags=pair, thinking_from_start=start_open)
