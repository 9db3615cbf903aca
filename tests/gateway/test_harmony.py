"""GPT-OSS's harmony answers (gateway/harmony.py, `--reasoning-parser openai_gptoss`): the
analysis channel is the reasoning, the other channels the content, headers and markers
dropped, calls to functions dropped or kept in the content for the `openai` tool-call parser;
whole answers and the same answers cut at every point agree; a chat request with the parser
runs with its special tokens kept (the markers are special tokens)."""

from __future__ import annotations

import pytest
from troupe.gateway.chat_reasoning import chat_reasoning
from troupe.gateway.harmony import CALL_OPEN, HarmonyStream
from troupe.gateway.reasoning import Split, constraint_reasoning, split_whole
from troupe.messages import SamplingParams

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"{ANALYSIS}User asks 2+2.<|end|>{FINAL}It is 4.<|return|>",
            ("User asks 2+2.", "It is 4."),
        ),
        (f"{ANALYSIS}User asks 2+2.<|end|>{FINAL}It is 4.", ("User asks 2+2.", "It is 4.")),
        (f"{ANALYSIS}Cut off in thought", ("Cut off in thought", None)),
        ("<|channel|>final<|message|>Only an answer.<|return|>", (None, "Only an answer.")),
        ("No harmony at all.", (None, "No harmony at all.")),
        (  # two rounds of thinking around a preamble on the commentary channel
            f"{ANALYSIS}One.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me "
            f"check.<|end|><|start|>assistant{ANALYSIS}Two.<|end|>{FINAL}Done.",
            ("One.Two.", "Let me check.Done."),
        ),
        (  # a call (a header naming a recipient and a format): not content
            f"{ANALYSIS}Weather?<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
            ("Weather?", None),
        ),
        (  # a call with its recipient in the role header, going on the prompt's
            " to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>",
            (None, None),
        ),
        (  # a built-in tool's input: on analysis, thinking; elsewhere dropped
            '<|channel|>analysis to=browser.search code<|message|>{"query": "x"}<|call|>'
            "<|start|>assistant to=python<|channel|>commentary code<|message|>1+1<|call|>",
            ('{"query": "x"}', None),
        ),
        ("to", (None, "to")),  # the start of a recipient that never came
        (f"{ANALYSIS}a < b and <|x|> are text<|end|>", ("a < b and <|x|> are text", None)),
        ("<|chan", (None, "<|chan")),  # a marker never completed is text
        ("x <|", (None, "x <|")),
    ],
)
def test_whole_and_at_every_split(text: str, expected: tuple[str | None, str | None]) -> None:
    assert split_whole("openai_gptoss", text) == Split(*expected)
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        stream = HarmonyStream()
        parts = [stream.feed(p) for p in pieces] + [stream.flush()]
        reasoning = "".join(p.reasoning or "" for p in parts) or None
        content = "".join(p.content or "" for p in parts) or None
        assert Split(reasoning, content) == Split(*expected), pieces


KEPT = f'{CALL_OPEN}get_weather<|channel|>commentary json<|message|>{{"city": "Paris"}}<|call|>'
CALL = (
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{ANALYSIS}Weather?<|end|><|start|>assistant{CALL}<|call|>", ("Weather?", KEPT)),
        (f"{ANALYSIS}Weather?<|end|><|start|>assistant{CALL}", ("Weather?", KEPT)),  # no stop
        (  # a preamble, then the call written as the template writes it
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions."
            'get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
            (None, f"Checking.{KEPT}"),
        ),
        (  # going on the prompt's header
            ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": '
            '"Paris"}',
            (None, KEPT),
        ),
        (f"{ANALYSIS}No call.<|end|>{FINAL}Hi.", ("No call.", "Hi.")),
    ],
)
def test_calls_kept_for_the_tool_parser(text: str, expected: tuple[str | None, str]) -> None:
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        stream = HarmonyStream(keeps_calls=True)
        parts = [stream.feed(p) for p in pieces] + [stream.flush()]
        reasoning = "".join(p.reasoning or "" for p in parts) or None
        content = "".join(p.content or "" for p in parts) or None
        assert (reasoning, content) == expected, pieces


def test_only_cut_markers_and_channel_names_are_held() -> None:
    stream = HarmonyStream()
    assert stream.feed("<|chan") == Split(None, None)
    assert stream.feed("nel|>anal") == Split(None, None)  # the channel's name may go on
    assert stream.feed("ysis<|message|>Think") == Split("Think", None)
    assert stream.feed("ing.<|e") == Split("ing.", None)
    assert stream.feed("nd|><|start|>assistant<|channel|>final<|message|>Hi") == Split(None, "Hi")
    assert stream.flush() == Split(None, None)


def test_a_chat_request_keeps_its_special_tokens() -> None:
    params = SamplingParams(max_tokens=8)
    assert params.skip_special_tokens
    splitter, run, _ = chat_reasoning("openai_gptoss", None, [], params)
    assert splitter is not None and not run.skip_special_tokens
    _, plain, _ = chat_reasoning("qwen3", None, [], params)
    assert plain.skip_special_tokens
    assert constraint_reasoning("openai_gptoss", "") == "harmony"


def test_the_openai_tool_parser_needs_the_harmony_reasoning_parser() -> None:
    from troupe.config import ConfigError
    from troupe.gateway.state import GatewaySettings
    from troupe.gateway.tool_auto import auto_tool_parser

    with pytest.raises(ConfigError, match=r"tool_call_parser openai .* reasoning_parser openai_"):
        GatewaySettings(tool_call_parser="openai")
    GatewaySettings(tool_call_parser="openai", reasoning_parser="openai_gptoss")
    template = '{{- "<|start|>assistant to=" }}{{- "functions." + tool_call.name }}'  # GPT-OSS's
    assert auto_tool_parser(None, "openai_gptoss", template) == "openai"
    assert auto_tool_parser(None, None, template) is None  # without harmony the calls are lost
