"""Trace record and replay: a recorded run replays with no divergence; damage is caught."""

from __future__ import annotations

import struct
from pathlib import Path

import anyio
import msgspec
import pytest
from graph_helpers import collect, wait_blocks_free
from troupe import Engine, EngineConfig, SamplingParams
from troupe.messages import GenerateRequest, StepResult, StructuredOutputs, TokenBatch
from troupe.messages.trace import TraceError, TraceRecord, TraceWriter, read_trace
from troupe.ops.cli import main as cli_main
from troupe.ops.replay import replay_trace

GOLDEN = Path(__file__).parent.parent / "fixtures" / "traces"


async def record_run(path: Path) -> None:
    config = EngineConfig(
        runner="fake",
        num_kv_blocks=64,
        num_cpu_blocks=32,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        trace_path=str(path),
    )
    async with Engine.open(config) as engine:
        async with anyio.create_task_group() as tg:
            for i in range(10):
                prompt = [100 + i] * (5 + 17 * i)
                tg.start_soon(collect, engine, prompt, SamplingParams(max_tokens=4 + i))
            tg.start_soon(collect, engine, "Hello, trace", {"max_tokens": 5, "stop": ["zz"]})
            tg.start_soon(collect, engine, "", {"max_tokens": 5})  # rejected
            tg.start_soon(collect, engine, "x", {"temperature": -1})  # rejected
            # structured output: the grammar actor's masks replay too; a bad regex is rejected
            regex = StructuredOutputs(regex="[a-z]{3,9}")
            tg.start_soon(
                collect, engine, "r", SamplingParams(max_tokens=6, structured_outputs=regex)
            )
            choice = StructuredOutputs(choice=("yes", "no"))
            tg.start_soon(
                collect, engine, "c", SamplingParams(max_tokens=6, structured_outputs=choice)
            )
            bad = StructuredOutputs(regex="(ab")
            tg.start_soon(
                collect, engine, "b", SamplingParams(max_tokens=6, structured_outputs=bad)
            )
        await wait_blocks_free(engine)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "run.trace"
    anyio.run(record_run, path)
    return path


def rewrite(src: Path, dst: Path, change) -> None:  # type: ignore[no-untyped-def]
    header, records = read_trace(src)
    writer = TraceWriter(dst, header)
    for rec in records:
        rec = change(rec)
        writer.record(rec.kind, rec.actor, rec.channel, rec.batch, rec.msg, rec.time)
    writer.close()


def test_recorded_run_replays_without_divergence(recorded: Path) -> None:
    report = replay_trace(recorded)
    assert report.ok, report.divergence and report.divergence.describe()
    assert set(report.actors) == {
        "tokenizer",
        "admission",
        "scheduler",
        "allocator",
        "grammar",
        "streamer",
    }
    assert report.num_checked > 50
    _, records = read_trace(recorded)
    channels = {(r.kind, r.actor, r.channel) for r in records}
    assert ("recv", "executor", "executor") in channels  # executor inbox recorded too
    assert ("recv", "grammar", "grammar") in channels  # masks were computed and replayed
    assert ("send", "streamer", "client") in channels


def test_altered_step_result_is_caught_at_the_token_batch(recorded: Path, tmp_path: Path) -> None:
    altered = tmp_path / "altered.trace"
    target: dict[str, int] = {}

    def change(rec: TraceRecord) -> TraceRecord:
        if (
            rec.kind == "recv"
            and isinstance(rec.msg, StepResult)
            and rec.msg.sampled
            and not target
        ):
            target["step"] = rec.msg.step_id
            first = rec.msg.sampled[0]
            sampled = (msgspec.structs.replace(first, token_id=first.token_id + 1),)
            new = msgspec.structs.replace(rec.msg, sampled=sampled + rec.msg.sampled[1:])
            return msgspec.structs.replace(rec, msg=new)
        return rec

    rewrite(recorded, altered, change)
    report = replay_trace(altered)
    assert report.divergence is not None
    d = report.divergence
    assert d.actor == "scheduler" and d.channel == "streamer"
    assert isinstance(d.expected, TokenBatch) and d.expected.step_id == target["step"]


def test_altered_sent_message_is_caught_at_that_message(recorded: Path, tmp_path: Path) -> None:
    altered = tmp_path / "altered2.trace"
    _, records = read_trace(recorded)
    sends = [
        r for r in records if r.kind == "send" and r.actor == "streamer" and r.channel == "client"
    ]
    victim = sends[len(sends) // 2]

    def change(rec: TraceRecord) -> TraceRecord:
        if rec.seq == victim.seq:
            return msgspec.structs.replace(rec, msg=msgspec.structs.replace(rec.msg, events=()))
        return rec

    rewrite(recorded, altered, change)
    d = replay_trace(altered).divergence
    assert d is not None and d.actor == "streamer" and d.channel == "client"
    assert d.index == len(sends) // 2


def test_truncated_and_corrupt_traces_give_clear_errors(
    recorded: Path, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    data = recorded.read_bytes()
    cut = tmp_path / "cut.trace"
    cut.write_bytes(data[: len(data) - 7])
    with pytest.raises(TraceError, match="truncated trace"):
        read_trace(cut)
    assert cli_main(["replay", str(cut)]) == 2
    assert "truncated trace" in capsys.readouterr().err
    bad = tmp_path / "bad.trace"
    (size,) = struct.unpack_from(">I", data, 0)
    junk = b"\xc1" * 40
    bad.write_bytes(data[: 4 + size] + struct.pack(">I", len(junk)) + junk)
    with pytest.raises(TraceError, match="corrupt trace: frame 1"):
        read_trace(bad)
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.trace")


def test_cli_replay_reports_divergence_and_exit_code(
    recorded: Path, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    assert cli_main(["replay", str(recorded)]) == 0
    assert "replay ok" in capsys.readouterr().out
    altered = tmp_path / "a.trace"

    def change(rec: TraceRecord) -> TraceRecord:
        if rec.kind == "send" and rec.actor == "admission" and rec.channel == "scheduler":
            return msgspec.structs.replace(
                rec, msg=msgspec.structs.replace(rec.msg, max_total_tokens=1)
            )
        return rec

    rewrite(recorded, altered, change)
    assert cli_main(["replay", str(altered)]) == 1
    out = capsys.readouterr().out
    assert "channel 'scheduler'" in out and "message #0" in out


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.trace")), ids=lambda p: p.name)
def test_golden_traces_replay(golden: Path) -> None:
    """Regression fixtures: re-record with `python -m troupe.ops.record_golden` when a message
    format or a core's policy changes on purpose."""
    report = replay_trace(golden)
    assert report.ok, report.divergence and report.divergence.describe()


def test_golden_traces_exist() -> None:
    assert len(list(GOLDEN.glob("*.trace"))) >= 2


def test_a_request_the_engine_would_refuse_is_a_trace_error(
    recorded: Path, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    """Replay checks client requests with the engine's own edge check: a bad one never drives
    the cores (an empty stop string would otherwise reach the streamer)."""
    altered = tmp_path / "bad-input.trace"
    done: list[str] = []

    def change(rec: TraceRecord) -> TraceRecord:
        if rec.kind == "recv" and isinstance(rec.msg, GenerateRequest) and not done:
            done.append(rec.msg.request_id)
            params = msgspec.structs.replace(rec.msg.params, stop=("",))
            return msgspec.structs.replace(rec, msg=msgspec.structs.replace(rec.msg, params=params))
        return rec

    rewrite(recorded, altered, change)
    with pytest.raises(TraceError, match=f"request '{done[0]}' has invalid stop"):
        replay_trace(altered)
    assert cli_main(["replay", str(altered)]) == 2
    assert "stop strings must be non-empty" in capsys.readouterr().err
