"""CPU smoke run of the structured-output benchmark: it runs end to end and prints its numbers."""

from __future__ import annotations

import re

import pytest
from troupe.ops.bench_structured import main, synthetic_vocab


def test_synthetic_vocab_is_distinct_and_names_specials() -> None:
    vocab = synthetic_vocab(2000, (1990, 1991))
    assert len(set(vocab)) == 2000 and vocab[1990] == "<|special1990|>"


def test_smoke_run_prints_both_step_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke", "--num-seqs", "6", "--max-tokens", "12", "--prompt-len", "8"]) == 0
    out = capsys.readouterr().out
    structured = re.search(r"structured: \S+s (\d+) steps", out)
    free = re.search(r"free: +\S+s (\d+) steps", out)
    # (the same lengths over the same prompts; the step counts may still differ by when the
    # requests reached the scheduler, so they are not compared)
    assert structured and free and int(structured.group(1)) > 0 and int(free.group(1)) > 0, out
    assert re.search(r"step time ratio structured/free: \d+\.\d{3}", out)
