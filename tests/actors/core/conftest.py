"""Shared by the grammar core tests: the default model's tokenizer and a grammar compiler for
its vocabulary (one each per module, as each test module built them). The imports are inside
the fixtures: the other tests of this folder do not pay for torch and xgrammar."""

from __future__ import annotations

import pytest

VOCAB = 49152  # the default model's (SmolLM2) vocabulary size


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    from troupe.actors.graph import load_tokenizer_for

    return load_tokenizer_for(None)


@pytest.fixture(scope="module")
def compiler(tok):  # type: ignore[no-untyped-def]
    from troupe.actors.core.grammar_compiler import grammar_compiler_for

    return grammar_compiler_for(tok, VOCAB, tok.eos_token_ids, 30.0)
