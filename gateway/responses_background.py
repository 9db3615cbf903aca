"""Background responses (OpenAI's `background: true`, vLLM's shapes): the create call answers
at once ("queued"), and the generation runs on in a task the app owns.

    create ─► store.put(queued object, is_running) ─► BackgroundRuns.start ─► task:
       engine.generate ─► OutputAssembler (streaming: each event kept, numbered)
          Finished           ─► "completed" / "incomplete"  (store.replace: the whole object)
          Rejected/Failed    ─► "failed" (error: the engine's code and message)
          task cancelled     ─► "cancelled": POST /v1/responses/{id}/cancel, DELETE, shutdown
    GET /v1/responses/{id}          while it runs, the object as of now (`response_now`: its
                                    status and the output so far, the item being written
                                    "in_progress" with its text so far); at its end, the
                                    stored whole object
    GET ...?stream=true             `follow`: the events so far, then live ones until the end

Cancelling the task leaves the engine stream early, which aborts the request (its blocks
freed; its one terminal event an Aborted). On app shutdown (`close`) every run is cancelled
alike, before the engine stops, and `close` waits (up to SHUTDOWN_GRACE s) for the engine's
terminal event of each request it had started (`on_event`, an engine event listener): the
engine has then ended them itself, not merely been told to. A run's events live in memory while it runs (bounded by its
max_output_tokens); at its end they go into the store with its object, counted in the byte
bound. Runs are not counted in Gateway.num_streams: a drain does not wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import structlog
from troupe.gateway.errors import ApiError, error_for_event
from troupe.gateway.responses_objects import Status
from troupe.gateway.responses_output import Event, OutputAssembler
from troupe.gateway.responses_store import ResponseStore, StoredResponse
from troupe.messages import Delta, Finished, StreamEvent

log = structlog.get_logger("troupe.gateway")

_json = msgspec.json.Encoder()
# s: the most close() waits for the engine to end the aborted requests (a bound for a busy
# machine: the ends normally come within milliseconds)
SHUTDOWN_GRACE = 30.0
ENDS = ("completed", "incomplete", "cancelled", "failed")


def sse_frame(event: Event) -> bytes:
    """One SSE event, named by its type as OpenAI names them."""
    return b"event: %s\ndata: %s\n\n" % (event["type"].encode(), _json.encode(event))


@dataclasses.dataclass(kw_only=True)
class BackgroundRun:
    """One running background response: its events so far and whether it has ended."""

    response_id: str
    items: bytes  # its input items' JSON, stored with each state
    assembler: OutputAssembler
    # engine field -> the field the client wrote (ResponsesRequest.client_fields), for errors
    client_fields: Mapping[str, str] = dataclasses.field(default_factory=dict)
    events: list[Event] = dataclasses.field(default_factory=list)
    status: Status = "queued"
    task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def is_done(self) -> bool:
        return self.status in ENDS

    def response_now(self) -> dict[str, Any]:
        """The response object as of now: its status and the assembler's output so far (the
        assembler owns the output; the store holds only the object of each state)."""
        return self.assembler.shape.body(self.status, self.assembler.output_so_far())

    def add(self, events: list[Event]) -> None:
        if events:
            self.events.extend(events)
            self._changed.set()
            self._changed = asyncio.Event()

    def end(self, status: Status) -> None:
        self.status = status
        self._changed.set()

    async def follow(self, starting_after: int) -> AsyncIterator[Event]:
        """Its events numbered after `starting_after`, those so far then live ones, to its end."""
        num_sent = max(0, starting_after + 1)
        while True:
            changed = self._changed
            while num_sent < len(self.events):
                yield self.events[num_sent]
                num_sent += 1
            if self.is_done:
                return
            await changed.wait()


class BackgroundRuns:
    """The background responses one gateway app runs; `close()` on shutdown cancels them."""

    def __init__(self, store: ResponseStore | None) -> None:
        self._store = store
        self._runs: dict[str, BackgroundRun] = {}
        self._in_engine: dict[str, asyncio.Event] = {}  # requests started, no terminal event yet

    def __len__(self) -> int:
        return len(self._runs)

    def on_event(self, event: StreamEvent, now: float) -> None:
        """An engine event listener (on the event loop): a run's request has ended there."""
        if event.is_terminal and (ended := self._in_engine.pop(event.request_id, None)):
            ended.set()

    def get(self, response_id: str) -> BackgroundRun | None:
        return self._runs.get(response_id)

    def start(self, run: BackgroundRun, events: AsyncIterator[StreamEvent]) -> dict[str, Any]:
        """Store `run` as queued and start it; the object the create call answers."""
        assert self._store is not None, "background responses need a store (parse checks it)"
        queued = run.assembler.shape.body("queued", [])
        self._store.put(self._entry(run, queued), is_running=True)
        self._runs[run.response_id] = run
        run.task = asyncio.create_task(self._run(run, events), name=run.response_id)
        return queued

    async def cancel(self, response_id: str) -> bool:
        """Cancel a running one and wait until its end is stored; False when it is not running."""
        run = self._runs.get(response_id)
        if run is None or run.task is None:
            return False
        run.task.cancel()
        await asyncio.wait({run.task})  # its own cancellation, not this caller's
        self._unstarted(run)
        return True

    async def close(self) -> None:
        """Cancel every run (the app shuts down) and wait for them to end."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for run in list(self._runs.values()):
            self._unstarted(run)
        waits = [asyncio.ensure_future(ended.wait()) for ended in self._in_engine.values()]
        if waits:
            _, late = await asyncio.wait(waits, timeout=SHUTDOWN_GRACE)
            for wait in late:
                wait.cancel()
            if late:
                log.warning("background requests not ended by the engine", count=len(late))

    def _unstarted(self, run: BackgroundRun) -> None:
        """A run cancelled before its task began never ran its body (nor asked the engine
        for anything): end it here."""
        if run.response_id in self._runs:
            self._end(run, "cancelled", None)

    async def _run(self, run: BackgroundRun, events: AsyncIterator[StreamEvent]) -> None:
        assembler = run.assembler
        status: Status = "failed"
        error: dict[str, Any] | None = None
        try:
            self._in_engine[run.response_id] = asyncio.Event()  # its first step submits it
            run.add(assembler.start())
            run.status = "in_progress"
            self._keep(run, assembler.shape.body("in_progress", []))
            # generate() is an async generator (EngineLike types it an AsyncIterator): closing
            # it early, cancelled here, aborts the request
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    if isinstance(event, Delta | Finished):
                        run.add(assembler.feed(event))
                        if assembler.response is not None:
                            status = assembler.response["status"]
                            self._keep(run, assembler.response)
                            return
                    else:
                        exc = error_for_event(event, run.client_fields)
                        error = {"code": exc.code or "server_error", "message": exc.message}
                        run.add(assembler.fail(exc))
                        return
            error = {"code": "server_error", "message": "the engine ended its stream early"}
        except asyncio.CancelledError:
            status = "cancelled"
            cut = ApiError(400, "the response was cancelled", code="response_cancelled")
            run.add(assembler.fail(cut))  # ends a follower's stream as a router knows ends
            raise
        except Exception as exc:  # a bug: the run fails, the app goes on
            log.exception("background response failed", request_id=run.response_id)
            error = {"code": "server_error", "message": repr(exc)[:200]}
        finally:
            self._end(run, status, error)

    def _end(self, run: BackgroundRun, status: Status, error: dict[str, Any] | None) -> None:
        if status in ("cancelled", "failed"):
            self._keep(run, run.assembler.shape.body(status, run.assembler.output, error=error))
        run.end(status)
        del self._runs[run.response_id]

    def _keep(self, run: BackgroundRun, response: dict[str, Any]) -> None:
        """Store the run's state: while it runs, as a running entry; at its end, finished."""
        assert self._store is not None
        entry = self._entry(run, response)
        if response["status"] in ENDS:
            if not self._store.replace(entry):  # deleted meanwhile, or too large to keep
                log.info("background response not stored", request_id=run.response_id)
        elif self._store.get(run.response_id) is not None:
            self._store.put(entry, is_running=True)

    def _entry(self, run: BackgroundRun, response: dict[str, Any]) -> StoredResponse:
        is_end = response["status"] in ENDS  # the events are kept once, at the end
        return StoredResponse(
            response_id=run.response_id,
            response=_json.encode(response),
            items=run.items,
            events=_json.encode(run.events) if is_end else b"",
        )
