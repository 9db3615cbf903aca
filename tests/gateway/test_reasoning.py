"""Reasoning parsers (gateway/reasoning.py): whole answers, and the same answers streamed in
deltas cut anywhere (tags split across deltas) giving the same parts."""

from __future__ import annotations

import random

import pytest
from troupe.gateway.reasoning import ReasoningStream, Split, constraint_reasoning, split_whole

QWEN_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking: false
QWEN_OPEN = "<|im_start|>assistant\n<think>\n"  # a thinking-only template


@pytest.mark.parametrize(
    ("name", "prompt", "text", "expected"),
    [
        (
            "deepseek_r1",
            "",
            "<think>\nLet me see.</think>\n\nIt is 4.",
            ("\nLet me see.", "\n\nIt is 4."),
        ),
        ("deepseek_r1", "", "Let me see.</think>It is 4.", ("Let me see.", "It is 4.")),
        ("deepseek_r1", "", "Still thinking when cut off", ("Still thinking when cut off", None)),
        ("deepseek_r1", "", "</think>Only an answer", (None, "Only an answer")),
        ("qwen3", "", "<think>\nHmm.\n</think>\n\nHello!", ("\nHmm.\n", "\n\nHello!")),
        (
            "qwen3",
            QWEN_OFF,
            "Hello! I use </think> in prose.",
            (None, "Hello! I use </think> in prose."),
        ),
        ("qwen3", "", "No tags at all.", (None, "No tags at all.")),
        ("qwen3", QWEN_OPEN, "Thinking.</think>Answer.", ("Thinking.", "Answer.")),
        ("qwen3", QWEN_OPEN, "Cut off in thought", ("Cut off in thought", None)),
        ("qwen3", "", "<think>Cut off", ("Cut off", None)),
        ("qwen3", "", "<thin", (None, "<thin")),
        ("qwen3", "", "<", (None, "<")),
        ("qwen3", "", "a < b", (None, "a < b")),
        ("deepseek_r1", "", "x </thin", ("x </thin", None)),
    ],
)
def test_whole_and_streamed_agree(name, prompt, text, expected) -> None:  # type: ignore[no-untyped-def]
    assert split_whole(name, text, prompt) == Split(*expected)
    rng = random.Random(len(text))
    for _ in range(30):  # cut anywhere: into characters, or random pieces
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 6))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream = ReasoningStream(name, prompt)
        parts = [stream.feed(p) for p in pieces] + [stream.flush()]
        reasoning = "".join(p.reasoning or "" for p in parts) or None
        content = "".join(p.content or "" for p in parts) or None
        assert Split(reasoning, content) == Split(*expected), pieces


def test_nothing_is_held_but_a_cut_tag() -> None:
    stream = ReasoningStream("qwen3")
    assert stream.feed("<th") == Split(None, None)  # maybe `<think>`
    assert stream.feed("ink>Step one") == Split("Step one", None)
    assert stream.feed(" and two</") == Split(" and two", None)  # `</` may start `</think>`
    assert stream.feed("think>Done") == Split(None, "Done")
    assert stream.feed(" </think> again") == Split(None, " </think> again")  # content stays
    assert stream.saw_end


DS_THINKING = "<｜User｜>Hi<｜Assistant｜><think>"  # V3.1's template, thinking: true
DS_PLAIN = "<｜User｜>Hi<｜Assistant｜></think>"  # thinking: false (its default)
GRANITE = ("Here is my thought process:", "Here is my response:")
HY = "<think>\n{}\n</think>\n<answer>\n{}\n</answer>"  # Hunyuan-A13B's answer
AP = ("<|inner_prefix|>", "<|inner_suffix|>")  # Apertus's thinking tags
EX_THINKING = "[|assistant|]<think>\n"  # EXAONE 4's template, enable_thinking: true
HY_OPEN = "<|extra_0|>assistant\n<think>\n"  # a prompt that leaves thinking open


@pytest.mark.parametrize(
    ("name", "prompt", "text", "expected"),
    [
        ("mistral", "", "[THINK]Let me see.[/THINK]It is 4.", ("Let me see.", "It is 4.")),
        ("mistral", "", "Hmm [THINK]x[/THINK]y", ("x", "Hmm y")),  # opens anywhere
        ("mistral", "", "  [THINK]x[/THINK]y", ("x", "  y")),
        ("mistral", "", "[THINK]Cut off", ("Cut off", None)),
        ("mistral", "", "No thinking.", (None, "No thinking.")),
        ("mistral", "", "a[/THINK]b", (None, "ab")),  # a stray end is dropped
        ("mistral", "", "[THINK]a[/THINK]b [THINK]c", ("a", "b [THINK]c")),  # only the first
        ("mistral", "", "a [THIN", (None, "a [THIN")),
        ("mistral", "", "<think>x</think>", (None, "<think>x</think>")),
        (
            "granite",
            "",
            f"{GRANITE[0]}\nStep one.\n{GRANITE[1]}\nIt is 4.",
            ("\nStep one.\n", "\nIt is 4."),
        ),
        ("granite", "", "Here's my thought process: x Here's my response: y", (" x ", " y")),
        ("granite", "", "Here is the answer.", (None, "Here is the answer.")),
        ("granite", "", "Here", (None, "Here")),
        ("granite", "", f"{GRANITE[0]} cut off", (" cut off", None)),
        ("granite", "", f"Sure. {GRANITE[0]} x", (None, f"Sure. {GRANITE[0]} x")),
        ("deepseek_v3", DS_THINKING, "Thought.</think>Answer.", ("Thought.", "Answer.")),
        ("deepseek_v3", DS_PLAIN, "x</think>y", (None, "x</think>y")),
        ("deepseek_v3", "", "Answer.", (None, "Answer.")),
        # Hunyuan-A13B: the answer in <answer> tags after its thinking, the tags taken away
        ("hunyuan_a13b", "", HY.format("Hm.\nOk.", "It is 4."), ("Hm.\nOk.", "It is 4.")),
        ("hunyuan_a13b", "", HY.format("", "Hi\n\nthere"), (None, "Hi\n\nthere")),
        ("hunyuan_a13b", "", "<answer>\nOnly this\n</answer>", (None, "Only this")),
        ("hunyuan_a13b", "", "No tags, a <b>tag</b>.", (None, "No tags, a <b>tag</b>.")),
        ("hunyuan_a13b", "", "<think>\nCut off in th", ("Cut off in th", None)),
        ("hunyuan_a13b", "", "x <answer> y", (None, "x <answer> y")),  # only a leading one
        ("hunyuan_a13b", HY_OPEN, "Thought.\n</think>\n<answer>\nA.", ("Thought.", "A.")),
        ("hunyuan_a13b", "", "  <answ", (None, "  <answ")),
        # ERNIE 4.5 Thinking: thinking from the start, the answer in <response> tags
        ("ernie45", "", "Hm.\n</think>\n\n<response>\nIt is 4.\n</response>\n", ("Hm.\n", "It is 4.")),
        ("ernie45", "", "Hm.</think>\nIt is 4.", ("Hm.", "\nIt is 4.")),
        ("ernie45", "", "<think>Hm.</think><response>4</response>", ("Hm.", "4")),
        ("ernie45", "", "Cut off in thought", ("Cut off in thought", None)),
        # EXAONE 4.0: its template opens <think> where enable_thinking is true
        ("exaone4", EX_THINKING, "Hm.\n</think>\n\nIt is 4.", ("Hm.\n", "\n\nIt is 4.")),
        ("exaone4", "[|assistant|]", "It is 4.", (None, "It is 4.")),
        # Apertus: its own special tokens around the thinking
        ("apertus", "", f"{AP[0]}Hm.{AP[1]}It is 4.", ("Hm.", "It is 4.")),
        ("apertus", f"<s>assistant{AP[0]}", f"Hm.{AP[1]}4", ("Hm.", "4")),  # opened in the prompt
        ("apertus", "", "It is 4. <think>x</think>", (None, "It is 4. <think>x</think>")),
        # OLMo 3 Think: read as qwen3
        ("olmo3", "<|im_start|>assistant\n<think>", "Hm.</think>4", ("Hm.", "4")),
        ("olmo3", "", "<think>Hm.</think>4", ("Hm.", "4")),
        ("olmo3", "", "4", (None, "4")),
    ],
)
def test_more_parsers_whole_and_at_every_split(name, prompt, text, expected) -> None:  # type: ignore[no-untyped-def]
    assert split_whole(name, text, prompt) == Split(*expected)
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        stream = ReasoningStream(name, prompt)
        parts = [stream.feed(p) for p in pieces] + [stream.flush()]
        reasoning = "".join(p.reasoning or "" for p in parts) or None
        content = "".join(p.content or "" for p in parts) or None
        assert Split(reasoning, content) == Split(*expected), pieces


def test_mistral_holds_only_a_cut_tag() -> None:
    stream = ReasoningStream("mistral")
    assert stream.feed("Ok [TH") == Split(None, "Ok ")
    assert stream.feed("INK]deep") == Split("deep", None)
    assert stream.feed(" thought[/") == Split(" thought", None)
    assert stream.feed("THINK]Done [/THINK]") == Split(None, "Done [/THINK]")


def test_constraint_reasoning_for_other_tags() -> None:
    """The grammar's thinking block is `<think>`: parsers with other tags constrain at once."""
    assert constraint_reasoning("mistral", "") == "none"
    assert constraint_reasoning("granite", "") == "none"
    assert constraint_reasoning("deepseek_v3", DS_THINKING) == "required"
    assert constraint_reasoning("deepseek_v3", DS_PLAIN) == "none"


def test_hunyuan_holds_only_what_may_be_a_tag() -> None:
    stream = ReasoningStream("hunyuan_a13b")
    assert stream.feed("<think>\nStep") == Split("Step", None)
    assert stream.feed(" one\n") == Split(" one", None)  # "\n" may begin "\n</think>"
    assert stream.feed("</think>\n<ans") == Split(None, None)  # maybe <answer>
    assert stream.feed("wer>\nSunny") == Split(None, "Sunny")
    assert stream.feed(".\n</ans") == Split(None, ".")
    assert stream.feed("wer>") == Split(None, None)
    assert stream.flush() == Split(None, None)


def test_hunyuan_tags_are_the_tokens_it_writes() -> None:
    """A thinking budget takes each parser's first tags: Hunyuan's with their newlines (its
    tokens end in ">\n"), so the budget finds the tags the model draws and forces the same."""
    from troupe.gateway.chat_reasoning import with_thinking_tags
    from troupe.messages import SamplingParams

    params = with_thinking_tags("hunyuan_a13b", SamplingParams(thinking_token_budget=8))
    assert params.thinking_tags == ("<think>\n", "\n</think>\n")
    assert not params.thinking_from_start
    assert constraint_reasoning("hunyuan_a13b", HY_OPEN) == "none"  # not the grammar's tags


def test_special_tags_keep_special_tokens_in_the_text() -> None:
    """Apertus's tags are special tokens: its requests keep them (as GPT-OSS's markers);
    Qwen3's are not, and its requests skip special tokens as asked."""
    from troupe.gateway.chat_reasoning import chat_reasoning
    from troupe.messages import ChatMessage, SamplingParams

    prompt = [ChatMessage(role="user", content="Hi")]
    for parser, skips in (("apertus", False), ("qwen3", True)):
        made = chat_reasoning(parser, None, prompt, SamplingParams())  # type: ignore[arg-type]
        assert made.params.skip_special_tokens is skips, parser
