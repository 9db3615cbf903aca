"""The inbox of an actor whose core runs in a thread of its own.

A thread actor (the executor, the grammar, the tokenizer) reads its inbox in its own thread, so
a message from another thread actor goes straight from one thread to the other: the executor's
GrammarTokens wake the grammar's thread, and the grammar's TokenMasks wake the executor's,
without a trip through the event loop (which a busy server keeps late by milliseconds). A
sender on the event loop puts without blocking while there is room, and waits in a worker
thread only when the inbox is full (backpressure, as a bounded anyio stream gives). A reader
that drains batches is woken at the sender's next checkpoint, so what the loop's tasks send in
one iteration is read as one batch, as an event-loop actor would drain it; one that takes a
message at a time (the executor: a plan) is woken at once.

It keeps anyio's channel contract where senders see it: `send` (async), `clone`, `close` /
`aclose` and `async with`; a closed receiver raises BrokenResourceError in senders, a closed
sender ClosedResourceError; when the last sender closes, the reader gets EndOfStream once the
messages in it are read.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import anyio
import anyio.lowlevel


class InboxCancelled(Exception):
    """The actor was cancelled: its thread stops after the handle() in progress."""


class ThreadInbox:
    """The receiving end (read by the actor's thread); `sender()` makes each sender's handle."""

    def __init__(self, max_buffer: float, *, batches: bool = True) -> None:
        # 0 (a rendezvous in anyio) holds one message here: a thread reader has no waiting
        # receive for a sender to meet, and one message in the queue is the same hand-off.
        self.max_buffer = max_buffer
        self.batches = batches  # loop senders wake the reader at their next checkpoint
        self._room = max(1.0, max_buffer)
        self._items: deque[Any] = deque()
        self._cond = threading.Condition()
        self._num_senders = 0
        self._is_closed = False  # the receiver is gone: sends fail
        self._is_cancelled = False
        self.num_blocked_senders = 0

    def sender(self) -> InboxSender:
        with self._cond:
            self._num_senders += 1
        return InboxSender(self)

    # -- the reader (the actor's thread) ----------------------------------------------------

    def get(self) -> Any:
        """The next message, blocking; EndOfStream when every sender has closed and it is
        empty; InboxCancelled once cancel() was called."""
        with self._cond:
            while not self._items:
                if self._is_cancelled:
                    raise InboxCancelled
                if self._num_senders == 0:
                    raise anyio.EndOfStream
                self._cond.wait()
            if self._is_cancelled:
                raise InboxCancelled
            item = self._items.popleft()
            self._cond.notify_all()  # room for a blocked sender
            return item

    def receive_nowait(self) -> Any:
        """The next message if one is waiting; WouldBlock otherwise."""
        with self._cond:
            if not self._items or self._is_cancelled:
                raise anyio.WouldBlock
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def cancel(self) -> None:
        """Wake the reader to stop (the actor's task was cancelled)."""
        with self._cond:
            self._is_cancelled = True
            self._cond.notify_all()

    def close(self) -> None:
        """The reader is done: senders (blocked ones too) get BrokenResourceError."""
        with self._cond:
            self._is_closed = True
            self._items.clear()
            self._cond.notify_all()

    def depth(self) -> int:
        return len(self._items)

    # -- the senders ------------------------------------------------------------------------

    def try_put(self, item: Any, *, wake: bool = True) -> bool:
        """Put if there is room; `wake` False: the reader is woken by a later wake()."""
        with self._cond:
            if self._is_closed:
                raise anyio.BrokenResourceError
            if len(self._items) >= self._room:
                return False
            self._items.append(item)
            if wake:
                self._cond.notify_all()
            return True

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def put(self, item: Any) -> None:
        """Put, blocking while the inbox is full."""
        with self._cond:
            self.num_blocked_senders += 1
            try:
                while not self._is_closed and len(self._items) >= self._room:
                    self._cond.wait()
            finally:
                self.num_blocked_senders -= 1
            if self._is_closed:
                raise anyio.BrokenResourceError
            self._items.append(item)
            self._cond.notify_all()

    def sender_closed(self) -> None:
        with self._cond:
            self._num_senders -= 1
            self._cond.notify_all()


class InboxSender:
    """One sender's handle on a ThreadInbox (close it once: the reader ends when all have)."""

    def __init__(self, inbox: ThreadInbox) -> None:
        self._inbox = inbox
        self._is_closed = False

    def put(self, item: Any) -> None:
        """Send from a thread (blocking while the inbox is full)."""
        if self._is_closed:
            raise anyio.ClosedResourceError
        self._inbox.put(item)

    def put_nowait(self, item: Any) -> bool:
        """Put from the event loop without waiting or yielding; False when the inbox is full.
        A reader that drains batches is not woken: call wake() once the batch is in."""
        if self._is_closed:
            raise anyio.ClosedResourceError
        return self._inbox.try_put(item, wake=not self._inbox.batches)

    def wake(self) -> None:
        self._inbox.wake()

    async def send(self, item: Any) -> None:
        """Send from the event loop: at once if there is room, else wait in a worker thread."""
        if self._is_closed:
            raise anyio.ClosedResourceError
        inbox = self._inbox
        if not inbox.try_put(item, wake=not inbox.batches):
            await anyio.to_thread.run_sync(inbox.put, item, abandon_on_cancel=True)
            return
        if not inbox.batches:
            await anyio.lowlevel.checkpoint()
            return
        try:
            await anyio.lowlevel.checkpoint()  # the loop's other tasks send theirs first
        finally:
            inbox.wake()

    def clone(self) -> InboxSender:
        if self._is_closed:
            raise anyio.ClosedResourceError
        return self._inbox.sender()

    def close(self) -> None:
        if not self._is_closed:
            self._is_closed = True
            self._inbox.sender_closed()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> InboxSender:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
