"""ops/spec_bench.py runs on the CPU (tiny model) and prints every row and the speedups."""

from __future__ import annotations

import re

import pytest
from troupe.ops.spec_bench import main


def test_spec_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--smoke", "--batches", "1", "2", "--prompt-len", "16", "--output-len", "12"]
    args += ["--repeats", "2"]  # the median of two runs per row
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


def test_spec_bench_rounds_in_child_processes(capsys: pytest.CaptureFixture[str]) -> None:
    """--rounds: every engine in a child process (ops/spec_isolated.py); the parent prints the
    median-time run of each row and the speedups from the children's rows."""
    args = ["--smoke", "--batches", "1", "--prompt-len", "16", "--output-len", "8"]
    assert main([*args, "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "median-time run of 1 rounds" in out, out
    for workload in ("matching", "nonmatching"):
        for mode in ("off", "ngram"):
            assert re.search(rf"^{workload} +batch=1 +{mode} +tok/s=", out, re.M), out
        assert re.search(rf"^{workload} +batch=1 +ITL +[\d.]+x", out, re.M), out
    # the children's matching workload is the generating child's continuations: it copies
    found = re.findall(r"^matching .* ngram .*acceptance=.*\((\d+)/(\d+)\)", out, re.M)
    assert len(found) == 1 and int(found[0][1]) > 0, out


def test_spec_bench_draft_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--smoke", "--batches", "1", "--prompt-len", "16", "--output-len", "8"]
    assert main([*args, "--draft", "self"]) == 0
    out = capsys.readouterr().out
    found = re.findall(r"^(\w+) +batch=1 +draft .*acceptance=.*\((\d+)/(\d+)\)", out, re.M)
    assert {w for w, _, _ in found} == {"matching", "nonmatching"}, out
    # the target drafting for itself: its proposals are its own draws, greedy or sampled
    assert all(int(p) > 0 and int(a) >= 0.8 * int(p) for _, a, p in found), out
    assert re.search(r"^speedup \(draft vs off\)", out, re.M), out


def test_spec_bench_isolated_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """--isolate-rows with --workload: only that workload's rows, each (batch, mode) from a child of
    its own."""
    args = ["--smoke", "--batches", "1", "2", "--prompt-len", "16", "--output-len", "8"]
    assert main([*args, "--rounds", "1", "--isolate-rows", "--workload", "matching"]) == 0
    out = capsys.readouterr().out
    for mode in ("off", "ngram"):
        for batch in (1, 2):  # each row's child sees every batch's prompts (one matching set)
            assert re.search(rf"^matching +batch={batch} +{mode} +tok/s=", out, re.M), out
    assert not re.search(r"^nonmatching ", out, re.M), out
