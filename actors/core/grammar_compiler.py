"""GrammarCompiler: a request's StructuredOutputs -> an xgrammar CompiledGrammar, cached.

Shared by the tokenizer core (which compiles at the client edge, in its worker thread, so a bad
schema or regex is rejected there, naming the field) and the grammar core (which finds the
compiled grammar in the cache). Compiles run in a small pool of their own threads; a caller
waits at most `timeout_s` (a compile cannot be interrupted: one past the limit finishes in the
pool and is cached, the request that waited is rejected). Failures are cached too, so the same
bad schema is refused at once. Thread-safe: xgrammar's compiler is, and the cache is locked.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from troupe.actors.core.grammar_writable import (
    TokenBytes,
    choice_error,
    first_step_error,
    forced_text_error,
)
from troupe.actors.core.spec_grammar import SPECIAL, spec_grammar
from troupe.messages.structured import StructuredOutputs

if TYPE_CHECKING:
    import xgrammar
    from troupe.actors.core.tokenizer_text import TextTokenizer

MAX_CACHED = 1024  # compiled grammars kept (LRU); a JSON schema's is tens of kilobytes


class GrammarError(ValueError):
    """A spec that does not compile (or not within the time limit); `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class GrammarCompiler:
    """Compiles and caches grammars for one tokenizer and model vocabulary."""

    def __init__(
        self,
        tokenizer: TextTokenizer | None,
        *,
        vocab: list[bytes] | None = None,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        timeout_s: float = 10.0,
        max_threads: int = 2,
    ) -> None:
        if (tokenizer is None) == (vocab is None):
            raise ValueError("a GrammarCompiler takes a tokenizer or its vocabulary's bytes")
        self._tokenizer = tokenizer
        self._vocab = vocab  # given: a process without the tokenizer (grammar_process.py)
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.timeout_s = timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_threads, "troupe-grammar")
        self._max_threads = max_threads
        self._lock = threading.Lock()
        self._cache: OrderedDict[StructuredOutputs, concurrent.futures.Future[object]]
        self._cache = OrderedDict()

    @functools.cached_property
    def _vocab_bytes(self) -> list[bytes]:
        if self._vocab is not None:
            return self._vocab
        assert self._tokenizer is not None
        return grammar_vocab(self._tokenizer, self.vocab_size)

    @functools.cached_property
    def _token_bytes(self) -> TokenBytes:
        return TokenBytes(self._vocab_bytes)

    @functools.cached_property
    def _special_ids(self) -> dict[str, int]:
        """The vocabulary's special tokens by text (grammar_vocab marks them)."""
        return {
            token[len(SPECIAL) :].decode("utf-8", "replace"): i
            for i, token in enumerate(self._vocab_bytes)
            if token.startswith(SPECIAL)
        }

    @functools.cached_property
    def _compiler(self) -> xgrammar.GrammarCompiler:
        """Built on first use (a second or so for a large vocabulary) from grammar_vocab."""
        import xgrammar

        info = xgrammar.TokenizerInfo(
            self._vocab_bytes,
            xgrammar.VocabType.RAW,
            vocab_size=self.vocab_size,
            stop_token_ids=list(self.eos_token_ids),
        )
        return xgrammar.GrammarCompiler(info, max_threads=self._max_threads)

    def compile(self, spec: StructuredOutputs) -> xgrammar.CompiledGrammar:
        """The compiled grammar of `spec`; raises GrammarError naming the field."""
        field = f"structured_outputs.{spec.kind}"
        with self._lock:
            self._compiler  # noqa: B018 -- built once, here: its time is not the spec's
            self._token_bytes  # noqa: B018 -- likewise (read by the pool's threads)
            self._special_ids  # noqa: B018 -- likewise
            future = self._cache.get(spec)
            if future is None:
                future = self._pool.submit(self._compile_now, spec)
                self._cache[spec] = future
                while len(self._cache) > MAX_CACHED:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(spec)
        try:
            compiled = future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise GrammarError(
                field,
                f"compiling {field} took longer than {self.timeout_s:g} s "
                "(grammar_compile_timeout_s); simplify it",
            ) from None
        except (RuntimeError, ValueError) as exc:  # xgrammar's parse and conversion errors
            raise GrammarError(field, f"invalid {field}: {_clean(exc)}") from None
        return compiled  # type: ignore[return-value]

    def _compile_now(self, spec: StructuredOutputs) -> xgrammar.CompiledGrammar:
        """Compiled, and refused (ValueError) when the vocabulary cannot write what it
        demands (grammar_writable.py): such a request would fail mid-stream."""
        compiled = self._compiler.compile_grammar(spec_grammar(spec, self._special_ids))
        why = choice_error(spec.choice, self._token_bytes) if spec.choice is not None else None
        why = why or first_step_error(compiled, self.vocab_size)
        why = why or forced_text_error(compiled, self._token_bytes)
        if why is not None:
            raise ValueError(why)
        return compiled

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def grammar_vocab(tokenizer: TextTokenizer, vocab_size: int) -> list[bytes]:
    """Each id's bytes as the grammar sees them: a special token's text behind SPECIAL (never
    valid UTF-8, so no text a grammar describes can be written with one; a grammar names one by
    id, as harmony's markers: spec_grammar.py); ids past the tokenizer's are the model's
    padding, with none."""
    special = tokenizer.special_ids
    return [
        b""
        if i >= tokenizer.vocab_size
        else SPECIAL + tokenizer.token_bytes(i)
        if i in special
        else tokenizer.token_bytes(i)
        for i in range(vocab_size)
    ]


def _clean(exc: Exception) -> str:
    """xgrammar's message without its `[time] /path/file.cc:line: ` prefix."""
    text = str(exc).strip()
    if text.startswith("[") and ": " in text:
        head, _, rest = text.partition(": ")
        if ".cc:" in head or ".h:" in head:
            return rest
    return text


@functools.lru_cache(maxsize=4)
def grammar_compiler_for(
    tokenizer: TextTokenizer, vocab_size: int, eos_token_ids: tuple[int, ...], timeout_s: float
) -> GrammarCompiler:
    """One compiler per (tokenizer, vocabulary) in a process: the tokenizer and grammar cores
    share its cache."""
    return GrammarCompiler(
        tokenizer, vocab_size=vocab_size, eos_token_ids=eos_token_ids, timeout_s=timeout_s
    )
