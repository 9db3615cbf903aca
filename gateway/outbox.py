"""A bounded per-connection buffer between the engine's event streams and one socket.

Pumps (one per request) read the engine's stream as fast as it yields and `put` encoded frames
here without ever awaiting the socket; one writer drains it to the socket at the client's pace.
So a slow reader never blocks the engine: when it falls further behind than the limits allow,
`put` raises `Overflow` and the connection is cut off with an error instead of growing memory.
"""

from __future__ import annotations

import asyncio
import collections


class Overflow(Exception):
    """The reader fell too far behind; the message names the limit it broke."""


class Outbox:
    """FIFO of text frames, bounded in count and in bytes. One writer, many putters."""

    def __init__(self, *, max_frames: int, max_bytes: int) -> None:
        if max_frames < 1 or max_bytes < 1:
            raise ValueError(f"Outbox limits must be >= 1, got {max_frames=} {max_bytes=}")
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._frames: collections.deque[str] = collections.deque()
        self._num_bytes = 0
        self._wakeup = asyncio.Event()
        self._closed = False
        self.overflowed: Overflow | None = None

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def put(self, frame: str) -> None:
        """Queue a frame; raise Overflow (once, and for every put after) past the limits."""
        if self.overflowed is not None:
            raise self.overflowed
        if self._closed:
            return  # the writer is gone: nobody will read this
        size = len(frame)
        if len(self._frames) + 1 > self.max_frames or self._num_bytes + size > self.max_bytes:
            self.overflowed = Overflow(
                f"client is too slow: {len(self._frames)} frames ({self._num_bytes} bytes) "
                f"unread, limits are {self.max_frames} frames and {self.max_bytes} bytes"
            )
            self._frames.clear()
            self._num_bytes = 0
            self._wakeup.set()
            raise self.overflowed
        self._frames.append(frame)
        self._num_bytes += size
        self._wakeup.set()

    def put_final(self, frame: str) -> None:
        """Queue a frame past the limits (a last error message after an overflow)."""
        self._frames.append(frame)
        self._num_bytes += len(frame)
        self._wakeup.set()

    def close(self) -> None:
        """No more frames will come; the writer ends once it has drained what is queued."""
        self._closed = True
        self._wakeup.set()

    async def get(self) -> str | None:
        """The next frame, or None once closed (or overflowed) and drained."""
        while not self._frames:
            if self._closed:
                return None
            self._wakeup.clear()
            await self._wakeup.wait()
        frame = self._frames.popleft()
        self._num_bytes -= len(frame)
        return frame

    async def get_all(self) -> list[str]:
        """Every queued frame (at least one), or [] once closed (or overflowed) and drained."""
        while not self._frames:
            if self._closed:
                return []
            self._wakeup.clear()
            await self._wakeup.wait()
        frames = list(self._frames)
        self._frames.clear()
        self._num_bytes = 0
        return frames
