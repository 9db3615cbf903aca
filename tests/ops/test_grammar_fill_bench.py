"""The grammar fill benchmark runs: masks filled and matchers walked for each thread count."""

from __future__ import annotations

import pytest
from troupe.ops.grammar_fill_bench import main

pytest.importorskip("xgrammar")


def test_the_bench_prints_one_line_per_thread_count(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--num-seqs", "4", "--threads", "1", "2", "--steps", "3", "--rounds", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "masks" in line]
    assert [line.split(",")[1].split()[0] for line in lines] == ["1", "2"]
    assert all(float(line.split(": ")[1].split()[0]) >= 0 for line in lines)
