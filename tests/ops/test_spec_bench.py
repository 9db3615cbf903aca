"""ops/spec_bench.py runs on the CPU (tiny model) and prints every row and the speedups."""

from __future__ import annotations

import re

import pytest
from troupe.ops.spec_bench import main


def test_spec_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--smoke", "--batches", "1", "2", "--prompt-len", "16", "--output-len", "12"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for workload in ("matching", "nonmatching"):
        for mode in ("off", "ngram"):
            for batch in (1, 2):
                assert re.search(rf"^{workload} +batch={batch} +{mode} +tok/s=", out, re.M), out
        assert re.search(rf"^{workload} +batch=2 +ITL +[\d.]+x +throughput", out, re.M), out
    # the speculative rows verified proposals and say how many were accepted
    found = re.findall(r"ngram .*acceptance=.*\((\d+)/(\d+)\)", out)
    assert len(found) == 4 and any(int(p) > 0 for _, p in found)
    assert all(int(a) <= int(p) for a, p in found)
