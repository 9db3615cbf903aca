"""CPU smoke run of the structured-output benchmark: it runs end to end and prints its numbers."""

from __future__ import annotations

import re

import pytest
from troupe.ops.bench_structured import main, synthetic_vocab


def test_synthetic_vocab_is_distinct_and_names_specials() -> None:
    vocab = synthetic_vocab(2000, (1990, 1991))
    assert len(set(vocab)) == 2000 and vocab[1990] == "<|special1990|>"


def test_smoke_run_prints_both_step_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke", "--num-seqs", "6", "--max-tokens", "12", "--prompt-len", "8",
                 "--repeats", "2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    structured = re.search(r"structured: (\d+\.\d+) ms/step \(median of 2, (\d+) steps each\)", out)
    free = re.search(r"free: +(\d+\.\d+) ms/step", out)
    repeats = re.search(r"per repeat \(structured / free ms/step\): (.*)", out)
    assert structured and free and repeats, out
    assert int(structured.group(2)) > 0 and float(free.group(1)) > 0
    assert len(repeats.group(1).split(", ")) == 2
    assert re.search(r"step time ratio structured/free: \d+\.\d{3}", out)
