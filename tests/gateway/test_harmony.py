"""GPT-OSS's harmony answers (gateway/harmony.py, `--reasoning-parser openai_gptoss`): the
analysis channel is the reasoning, the other channels the content, headers and markers
dropped; whole answers and the same answers cut at every point agree; a chat request with the
parser runs with its special tokens kept (the markers are special tokens)."""

from __future__ import annotations

import pytest
from troupe.gateway.chat_reasoning import chat_reasoning
from troupe.gateway.harmony import HarmonyStream
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
        (  # a header naming a recipient and a format
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"city": "Paris"}<|call|>',
            (None, '{"city": "Paris"}'),
        ),
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
    splitter, run = chat_reasoning("openai_gptoss", None, [], params)
    assert splitter is not None and not run.skip_special_tokens
    _, plain = chat_reasoning("qwen3", None, [], params)
    assert plain.skip_special_tokens
    assert constraint_reasoning("openai_gptoss", "") == "none"
