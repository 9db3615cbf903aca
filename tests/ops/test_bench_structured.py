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
    assert re.search(r"steady steps .*; ratio of medians \d+\.\d{3}", out)


def test_steady_steps_are_the_full_batch_ones() -> None:
    from troupe.ops.bench_structured import steady_step_ms

    # (time s, steps so far, running): a 50 ms prefill, 1 ms steps at 8 running (one step
    # slow), then a tail of 2 running at 3 ms a step
    snaps = [(0.0, 0, 8), (0.05, 1, 8), (0.051, 2, 8), (0.052, 3, 8), (0.062, 4, 8),
             (0.063, 5, 8), (0.064, 6, 2), (0.067, 7, 2), (0.070, 8, 2)]  # fmt: skip
    assert abs(steady_step_ms(snaps, 4) - 1.0) < 1e-6  # median of 50, 1, 1, 10, 1, 1
    assert abs(steady_step_ms(snaps, 1) - 2.0) < 1e-6  # the tail's two 3 ms steps join
    assert steady_step_ms(snaps[:1], 4) != steady_step_ms(snaps[:1], 4)  # none: NaN
