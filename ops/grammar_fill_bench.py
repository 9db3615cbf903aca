"""How long xgrammar takes to fill one step's token masks, by thread count (issue 11).

    python -m troupe.ops.grammar_fill_bench [--num-seqs 256] [--threads 1 2 4] [--steps 30]

Compiles --num-seqs JSON schemas (ops/json_schemas.py) for the default model's vocabulary, one
matcher each, then for --steps steps times one BatchGrammarMatcher.batch_fill_next_token_bitmask
over all of them (what the grammar actor does per masked step: actors/core/grammar.py) and
advances every matcher by a random token its mask allows (seeded). Prints the median fill time
per thread count, rounds alternating, so EngineConfig.grammar_threads can be set from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np
from troupe.actors.core.grammar_compiler import GrammarCompiler
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.config import resolve_model_path
from troupe.messages.structured import StructuredOutputs
from troupe.ops.json_schemas import make_schemas

if TYPE_CHECKING:
    import xgrammar


def fill_ms(
    grammars: list[xgrammar.CompiledGrammar],
    vocab_size: int,
    stops: np.ndarray,
    threads: int,
    steps: int,
) -> float:
    """Median ms of one batch fill over all matchers, walking `steps` steps (never into a
    stop token, so the walk stays inside the grammar)."""
    import xgrammar

    rng = np.random.default_rng(0)
    matchers = [xgrammar.GrammarMatcher(g) for g in grammars]
    batch = xgrammar.BatchGrammarMatcher(threads)
    bitmask = np.empty((len(matchers), (vocab_size + 31) // 32), dtype=np.int32)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        batch.batch_fill_next_token_bitmask(matchers, bitmask)
        times.append(time.perf_counter() - start)
        for row, matcher in zip(bitmask, matchers, strict=True):
            if matcher.is_terminated():
                continue
            bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab_size]
            allowed = np.flatnonzero(bits)
            allowed = allowed[~np.isin(allowed, stops)]
            if len(allowed):
                matcher.accept_token(int(rng.choice(allowed)))
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(resolve_model_path(None), None)
    eos = tuple(tokenizer.eos_token_ids)
    stops = np.asarray(eos, dtype=np.int64)
    compiler = GrammarCompiler(tokenizer, vocab_size=tokenizer.vocab_size, eos_token_ids=eos)
    grammars = [
        compiler.compile(StructuredOutputs(json=json.dumps(schema)))
        for schema in make_schemas(args.num_seqs)
    ]
    results: dict[int, list[float]] = {t: [] for t in args.threads}
    for _ in range(args.rounds):
        for threads in args.threads:
            results[threads].append(
                fill_ms(grammars, tokenizer.vocab_size, stops, threads, args.steps)
            )
    for threads, values in results.items():
        runs = " / ".join(f"{v:.2f}" for v in values)
        print(f"{args.num_seqs} masks, {threads} thread(s): {runs} ms per fill (median per round)")


if __name__ == "__main__":
    main()
