"""Structured output under harmony (StructuredOutputs.reasoning "harmony", GPT-OSS's
`--reasoning-parser openai_gptoss`): with SmolLM2's tokenizer plus harmony's markers as special
tokens, the grammar lets the model think in analysis messages, then holds the final channel's
body to the schema. Each answer is fed to an xgrammar matcher token by token, as the grammar
core feeds it; special tokens stay out of every text rule."""

from __future__ import annotations

import numpy as np
import pytest
from troupe.actors.core.grammar_compiler import GrammarCompiler, GrammarError, grammar_vocab
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages.structured import HARMONY_MARKERS, StructuredOutputs

SCHEMA = '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}'
HARMONY = StructuredOutputs(json=SCHEMA, reasoning="harmony")
ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|channel|>final<|message|>"
NEXT = "<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    plain = load_tokenizer()
    inner = plain.tokenizer
    inner.add_special_tokens(list(HARMONY_MARKERS))
    return TextTokenizer(
        inner,
        source="smollm2+harmony",
        bos_token_id=None,
        eos_token_ids=plain.eos_token_ids,
        chat_template=None,
    )


def _compiler(tokenizer: TextTokenizer) -> GrammarCompiler:
    return GrammarCompiler(
        tokenizer, vocab_size=tokenizer.vocab_size, eos_token_ids=tokenizer.eos_token_ids
    )


def _accepted(compiler: GrammarCompiler, spec: StructuredOutputs, ids: list[int]) -> int:
    """How many of `ids` the grammar takes, each one allowed by the mask before it."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(compiler.compile(spec))
    mask = np.zeros((1, (compiler.vocab_size + 31) // 32), dtype=np.int32)
    for done, token_id in enumerate(ids):
        matcher.fill_next_token_bitmask(mask)
        if not (mask[0, token_id // 32] >> (token_id % 32)) & 1:
            return done
        assert matcher.accept_token(token_id)
    return len(ids)


@pytest.mark.parametrize(
    "answer",
    [
        f'{ANALYSIS}The user wants a city. Paris.{NEXT}{FINAL}{{"city": "Paris"}}',
        f'{ANALYSIS}One.{NEXT}{ANALYSIS}Two, "quoted" {{braces}}.{NEXT}{FINAL}{{"city": "Rome"}}',
        f'{FINAL}{{"city": "Oslo"}}',  # no thinking at all
    ],
)
def test_thinking_then_the_final_body_follows_the_schema(
    tokenizer: TextTokenizer, answer: str
) -> None:
    ids = [*tokenizer.encode(answer, False), tokenizer.eos_token_ids[0]]
    assert _accepted(_compiler(tokenizer), HARMONY, ids) == len(ids)


@pytest.mark.parametrize(
    ("taken", "refused"),
    [
        ("", '{"city": "Paris"}'),  # no harmony: the header must come first
        (f"{ANALYSIS}Hm.<|end|>", FINAL),  # the next message's <|start|> first
        (f"{FINAL}{{", '"town": "Paris"}'),  # the schema holds the final body
        (f'{FINAL}{{"city": "', '<|end|>"}'),  # no marker inside the JSON
        (f"{ANALYSIS}a", "<|call|>"),  # no other marker inside the thinking
        ("<|channel|>", "commentary<|message|>"),  # only analysis, then final
    ],
)
def test_what_the_grammar_refuses(tokenizer: TextTokenizer, taken: str, refused: str) -> None:
    """`taken` goes in whole; the grammar refuses a token of `refused` (its first, where that is
    a marker)."""
    head = tokenizer.encode(taken, False)
    ids = head + tokenizer.encode(refused, False)
    accepted = _accepted(_compiler(tokenizer), HARMONY, ids)
    assert len(head) <= accepted < len(ids)
    if refused.startswith("<|"):
        assert accepted == len(head)


def test_special_tokens_stay_out_of_text_rules(tokenizer: TextTokenizer) -> None:
    """Every special token has bytes in the grammar's vocabulary (so harmony can name one), and
    no text rule allows one: a string schema's body, a regex of any text."""
    vocab = grammar_vocab(tokenizer, tokenizer.vocab_size)
    special = sorted(tokenizer.special_ids)
    assert all(vocab[i].startswith(b"\xff") for i in special)
    compiler = _compiler(tokenizer)
    for spec in (
        StructuredOutputs(json='{"type": "string"}'),
        StructuredOutputs(regex="(.|\\n)*"),
    ):
        for token_id in special:
            if token_id in tokenizer.eos_token_ids:
                continue  # a stop token ends a finished grammar
            ids = [*tokenizer.encode('"a', False), token_id]
            assert _accepted(compiler, spec, ids) < len(ids), (spec, token_id)


def test_a_vocabulary_without_the_markers_is_refused_naming_them() -> None:
    plain = load_tokenizer()
    compiler = _compiler(plain)
    with pytest.raises(GrammarError, match=r"harmony's markers .* no <\|start\|>") as caught:
        compiler.compile(HARMONY)
    assert caught.value.field == "structured_outputs.json"
