"""CPU smoke run of the masked-step probe (ops/masked_step_probe.py): every method it wraps still
exists (a rename fails here, not on the next device call), it reports masked steps and the
calls it timed, and the run leaves the classes as they were."""

from __future__ import annotations

import re

import pytest
from troupe.gpu.model_runner import ModelRunner
from troupe.ops.masked_step_probe import Probe, Span, main, masked_steps


def test_smoke_run_reports_the_masked_path(capsys: pytest.CaptureFixture[str]) -> None:
    launch, finish = ModelRunner.launch, ModelRunner.finish
    assert main(["--smoke", "--num-seqs", "6", "--max-tokens", "10", "--prompt-len", "8",
                 "--repeats", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    steps = re.search(r"masked steps after a masked step: (\d+)", out)
    assert steps and int(steps.group(1)) > 0, out
    for tag in ("launch", "finish", "scheduler", "allocator", "grammar", "batch.build"):
        calls = re.search(rf"^  {re.escape(tag)} +(\d+) ", out, re.M)
        assert calls and int(calls.group(1)) > 0, (tag, out)
    assert ModelRunner.launch is launch and ModelRunner.finish is finish


def test_a_step_is_timed_from_the_previous_finish() -> None:
    spans = [
        Span(0.0, 1.0, "finish"),
        Span(1.5, 1.6, "plan", (2, True, 1)),
        Span(1.6, 1.9, "launch"),
        Span(1.8, 1.8, "masks", (1, True)),
        Span(2.0, 2.5, "finish"),
        Span(3.0, 3.1, "plan", (3, False, None)),  # not masked: no row
        Span(3.5, 3.6, "finish"),
    ]
    rows = masked_steps(spans)
    assert rows["plan arrives"] == [0.5] and rows["masks arrive"] == [0.8]
    assert rows["step"] == [1.5] and len(rows["launch"]) == 1


def test_installed_restores_what_it_wrapped() -> None:
    before = ModelRunner.execute
    with Probe().installed():
        assert ModelRunner.execute is not before
    assert ModelRunner.execute is before
