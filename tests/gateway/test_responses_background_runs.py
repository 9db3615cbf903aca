"""BackgroundRuns on its own (no server): a run the engine rejects ends "failed" with the
engine's code and its events end in an `error` event; a run cancelled before its task began
(so before it asked the engine for anything) ends "cancelled" all the same; a running one is
never evicted by the store's bound, and the store holds its end once it ends; a running one's
object as of now shows the output so far."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
from troupe.gateway.responses_background import BackgroundRun, BackgroundRuns
from troupe.gateway.responses_objects import ResponseShape
from troupe.gateway.responses_output import OutputAssembler
from troupe.gateway.responses_store import ResponseStore, StoredResponse
from troupe.messages import (
    Delta,
    Finished,
    FinishReason,
    RejectCode,
    Rejected,
    StreamEvent,
    Timings,
    Usage,
)


def _run(response_id: str) -> BackgroundRun:
    shape = ResponseShape(response_id, "m", {"background": True})
    assembler = OutputAssembler(shape, None, None, is_streaming=True)
    return BackgroundRun(response_id=response_id, items=b"[]", assembler=assembler)


def _status(store: ResponseStore, response_id: str) -> str:
    entry = store.get(response_id)
    assert entry is not None, response_id
    status: str = msgspec.json.decode(entry.response)["status"]
    return status


def test_a_rejected_run_fails_with_the_engines_reason() -> None:
    async def events() -> AsyncIterator[StreamEvent]:
        yield Delta(request_id="r", text="Hel", token_ids=(1,))
        yield Rejected(request_id="r", code=RejectCode.TOO_LONG, message="prompt too long")

    async def main() -> None:
        store = ResponseStore(max_entries=4, max_bytes=1 << 20)
        runs = BackgroundRuns(store)
        run = _run("resp_a")
        assert runs.start(run, events())["status"] == "queued"
        assert run.task is not None
        await run.task
        entry = store.get("resp_a")
        assert entry is not None and len(runs) == 0
        body = msgspec.json.decode(entry.response)
        assert body["status"] == "failed" and "too long" in body["error"]["message"]
        assert body["output"] == []  # the open item was never closed: nothing half-written
        kinds = [e["type"] for e in entry.stream_events()]
        assert kinds[0] == "response.created" and kinds[-1] == "error"
        assert "response.output_text.delta" in kinds

    asyncio.run(main())


def test_a_run_cancelled_before_it_began_ends_cancelled() -> None:
    began = []

    async def events() -> AsyncIterator[StreamEvent]:
        began.append(True)
        yield Delta(request_id="r", text="x", token_ids=(1,))

    async def main() -> None:
        store = ResponseStore(max_entries=4, max_bytes=1 << 20)
        runs = BackgroundRuns(store)
        runs.start(_run("resp_b"), events())
        assert await runs.cancel("resp_b")  # no await between: its task never ran
        assert _status(store, "resp_b") == "cancelled" and len(runs) == 0 and not began
        assert not await runs.cancel("resp_b")  # not running any more

    asyncio.run(main())


def test_running_entries_are_never_evicted() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def events() -> AsyncIterator[StreamEvent]:
            await release.wait()
            yield Delta(request_id="r", text="x", token_ids=(1,))

        store = ResponseStore(max_entries=2, max_bytes=1 << 20)
        runs = BackgroundRuns(store)
        runs.start(_run("resp_running"), events())
        for k in range(3):  # finished ones past the bound: the oldest finished go first
            store.put(StoredResponse(response_id=f"resp_{k}", response=b"{}", items=b"[]"))
        assert store.get("resp_running") is not None and store.num_running == 1
        assert [store.get(f"resp_{k}") is not None for k in range(3)] == [False, False, True]
        await runs.close()  # as the app's shutdown does
        assert _status(store, "resp_running") == "cancelled" and store.num_running == 0

    asyncio.run(main())


def test_a_running_ones_object_shows_the_output_so_far() -> None:
    async def main() -> None:
        said, go = asyncio.Event(), asyncio.Event()

        async def events() -> AsyncIterator[StreamEvent]:
            yield Delta(request_id="r", text="Hel", token_ids=(1,))
            yield Delta(request_id="r", text="lo", token_ids=(2,))
            said.set()  # runs once the run asks for the next event: both deltas were fed
            await go.wait()
            yield Finished(
                request_id="r",
                text=" there",
                token_ids=(3,),
                finish_reason=FinishReason.STOP,
                usage=Usage(prompt_tokens=4, completion_tokens=3),
                timings=Timings(ttft=None, tpot=None, e2e=0.0),
            )

        store = ResponseStore(max_entries=4, max_bytes=1 << 20)
        runs = BackgroundRuns(store)
        run = _run("resp_p")
        assert runs.start(run, events())["output"] == []
        assert run.response_now()["status"] == "queued"
        await said.wait()
        now = run.response_now()
        assert (now["id"], now["status"], now["usage"]) == ("resp_p", "in_progress", None)
        (item,) = now["output"]
        assert (item["type"], item["status"]) == ("message", "in_progress")
        assert [part["text"] for part in item["content"]] == ["Hello"]
        assert _status(store, "resp_p") == "in_progress"  # the store keeps the state alone
        go.set()
        assert run.task is not None
        await run.task
        entry = store.get("resp_p")
        assert entry is not None
        (done,) = msgspec.json.decode(entry.response)["output"]
        assert (done["id"], done["status"]) == (item["id"], "completed")  # the same item, whole
        assert [part["text"] for part in done["content"]] == ["Hello there"]

    asyncio.run(main())
