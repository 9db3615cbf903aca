"""The grammar actor's core in a process of its own (EngineConfig.grammar_worker).

Every xgrammar call lets go of the interpreter lock and must take it back to return. Beside an
event loop that is busy with a step's results (scheduler, streamer, readers) and an executor
thread that is planning the next launch, each of those takes waits for a switch interval: on
the H200's host a masked step's batch accept of 256 tokens took 3.4 ms in the engine (0.5 ms
alone), and the grammar's whole step 4.8 ms, all of it on the step's critical path
(docs/benchmarks.md, session 9). In a process of its own the grammar has an interpreter to
itself.

    grammar actor (a thread of the engine)          child process
    GrammarProcess.handle(batch) --msgpack, pipe-->  GrammarCore.handle(batch)
                                 <--headers, pipe--  masks' bits filled in a shared file
    TokenMasks (bits copied out) -> executor

The actor's thread waits for each answer (the pipe read lets go of the lock once), so the
protocol, the order of messages and the outputs are the GrammarCore's (replay and tests see
one core either way). The bits travel through a memory-mapped file in /dev/shm cut into
slots, each sized for two full steps: the parent hands each batch a free slot, xgrammar fills
the masks there (`_SharedBuffers`, the core's MaskBuffers) and each TokenMasks carries a view
of its bits in the file, not a copy (5 MB a masked step at 256 rows of a 152k vocabulary,
copied under the interpreter lock: ~0.5 ms of the engine's critical path on the H200's host,
docs/benchmarks.md, session 26). A slot is free again once no view of it is alive (`_Slots`),
so a message's bits never change under whoever holds it; with every slot held, or masks that
do not fit, the child sends the bits inline. `pin`, given on CUDA, page-locks the file
(gpu/pinned_host.py), so the executor's upload reads a view by DMA without a copy either.
The child is spawned when the actor is built (its imports overlap the engine's start) and
stops when the pipe closes. A batch of releases alone (ComputeMasks without rows: requests
that ended) asks nothing: it waits and goes out in front of the next batch, in order, so the
step that frees requests pays no round trip of its own beside the executor's launch.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import numpy as np
from troupe.actors.core.base import Outgoing
from troupe.actors.core.grammar import MaskBuffers
from troupe.child_processes import child_context
from troupe.messages.executor import TokenMasks
from troupe.messages.grammar import ComputeMasks, GrammarInbox


class _Masks(msgspec.Struct, frozen=True, array_like=True):
    """A TokenMasks with its bits left out (`bitmask` empty) or inline; `offset`: where in the
    shared file they are (-1: inline)."""

    masks: TokenMasks
    offset: int = -1


class _Reply(msgspec.Struct, frozen=True):
    masks: tuple[_Masks, ...] = ()
    error: str | None = None  # the core raised: the actor fails with this


class _Batch(msgspec.Struct, frozen=True, array_like=True):
    """A batch for the child and where in the shared file its masks go (size 0: inline)."""

    messages: list[GrammarInbox]
    start: int = 0
    size: int = 0


# The executor keeps the latest ahead and fresh masks (two slots) while the next batch fills a
# third; a fourth spares a batch the inline fallback while an upload still holds its source.
NUM_SLOTS = 4


class _Slots:
    """The shared file's slots and the views of each handed out in messages: a slot is free
    when none of them is alive."""

    def __init__(self, shared: mmap.mmap, count: int) -> None:
        self.file = np.frombuffer(shared, dtype=np.uint8)
        self.size = len(self.file) // count
        self._views: list[list[weakref.ref[np.ndarray]]] = [[] for _ in range(count)]

    def take(self) -> int | None:
        """A free slot (its views forgotten), or None while every one is held."""
        for slot, views in enumerate(self._views):
            if all(view() is None for view in views):
                views.clear()
                return slot
        return None

    def view(self, slot: int, offset: int, nbytes: int) -> memoryview:
        """The bytes at `offset` (in the file, inside `slot`), kept from reuse while alive."""
        assert slot * self.size <= offset and offset + nbytes <= (slot + 1) * self.size
        view = self.file[offset : offset + nbytes]
        self._views[slot].append(weakref.ref(view))
        return view.data  # a memoryview that keeps `view` alive


class GrammarProcess:
    """Core (inbox: ComputeMasks, GrammarTokens; outbox "executor"): GrammarCore's answers,
    computed in a child process."""

    def __init__(
        self,
        vocab: list[bytes],
        *,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        timeout_s: float,
        max_threads: int,
        max_rows: int,
        pin: Callable[[mmap.mmap], Callable[[], None]] | None = None,
    ) -> None:
        num_words = (vocab_size + 31) // 32
        self._size = NUM_SLOTS * 2 * max_rows * num_words * 4  # a slot: two full steps' masks
        self._shared, path = _shared_file(self._size)
        self._slots = _Slots(self._shared, NUM_SLOTS)
        unpin = pin(self._shared) if pin is not None else None
        context = child_context()
        self._conn, child_end = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child_end, path, self._size, vocab, vocab_size, eos_token_ids, timeout_s),
            kwargs={"max_threads": max_threads},
            name="troupe-grammar",
            daemon=True,
        )
        self._process.start()
        child_end.close()
        self._path: str | None = path  # unlinked once the child has it open (first answer)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(_Reply)
        self._finalizer = weakref.finalize(self, _stop, self._conn, self._process, path, unpin)
        self._held: list[GrammarInbox] = []  # releases alone, sent before the next batch

    def handle(self, batch: Sequence[GrammarInbox]) -> Outgoing:
        if all(isinstance(msg, ComputeMasks) and not msg.rows for msg in batch):
            self._held.extend(batch)  # nothing to answer: no round trip for it alone
            return []
        batch, self._held = [*self._held, *batch], []
        slot = self._slots.take()
        size = 0 if slot is None else self._slots.size
        start = 0 if slot is None else slot * size
        try:
            self._conn.send_bytes(self._encoder.encode(_Batch(list(batch), start, size)))
            reply = self._decoder.decode(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            code = self._process.exitcode
            raise RuntimeError(f"the grammar process stopped (exit code {code})") from exc
        if self._path is not None:
            os.unlink(self._path)
            self._path = None
        if reply.error is not None:
            raise RuntimeError(f"the grammar process failed: {reply.error}")
        out: Outgoing = []
        for item in reply.masks:
            masks = item.masks
            if item.offset >= 0:
                assert slot is not None, "the child filled no slot it was given"
                nbytes = len(masks.request_ids) * masks.num_words * 4
                bits = self._slots.view(slot, item.offset, nbytes)
                masks = msgspec.structs.replace(masks, bitmask=bits)
            out.append(("executor", masks))
        return out

    def close(self) -> None:
        self._finalizer()


SHM = "/dev/shm"


def _shared_file(size: int) -> tuple[mmap.mmap, str]:
    """A file of `size` bytes mapped in memory, in /dev/shm where it has the room (its pages
    reserved now: a full /dev/shm would otherwise kill the child with SIGBUS at its first
    write), else in the temporary directory."""
    places = [SHM] if os.path.isdir(SHM) else []
    for where in [*places, None]:
        fd, path = tempfile.mkstemp(prefix="troupe-masks-", dir=where)
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            return mmap.mmap(fd, size), path
        except OSError as exc:
            os.unlink(path)
            error = exc
        finally:
            os.close(fd)
    raise RuntimeError(f"no room for the grammar's {size / 2**20:.0f} MiB mask file: {error}")


def _stop(conn: Connection, process: Any, path: str, unpin: Callable[[], None] | None) -> None:
    conn.close()  # the child's read ends: it returns
    process.join(timeout=5)
    if process.is_alive():
        process.kill()
    if os.path.exists(path):
        os.unlink(path)
    if unpin is not None:
        unpin()


def _serve(
    conn: Connection,
    path: str,
    size: int,
    vocab: list[bytes],
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
    timeout_s: float,
    *,
    max_threads: int,
) -> None:
    """The child: a GrammarCore answering batches until the pipe closes."""
    from troupe.actors.core.grammar import GrammarCore
    from troupe.actors.core.grammar_compiler import GrammarCompiler

    with open(path, "r+b") as file:
        shared = mmap.mmap(file.fileno(), size)
    compiler = GrammarCompiler(
        None, vocab=vocab, vocab_size=vocab_size, eos_token_ids=eos_token_ids, timeout_s=timeout_s
    )
    buffers = _SharedBuffers(shared)
    core = GrammarCore(compiler, max_threads=max_threads, buffers=buffers)
    decoder = msgspec.msgpack.Decoder(_Batch)
    encoder = msgspec.msgpack.Encoder()
    while True:
        try:
            batch = decoder.decode(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            buffers.reset(batch.start, batch.size)
            out = core.handle(batch.messages)  # one TokenMasks per array made, in order
            placed = []
            for (_, masks), offset in zip(out, buffers.offsets, strict=True):
                assert isinstance(masks, TokenMasks)
                placed.append(_Masks(masks, offset))
            reply = _Reply(masks=tuple(placed))
        except Exception as exc:  # a bug: the parent fails the actor with it
            reply = _Reply(error=f"{type(exc).__name__}: {exc}")
        conn.send_bytes(encoder.encode(reply))


class _SharedBuffers(MaskBuffers):
    """The masks of one batch, filled in its slot of the shared file one after another while
    they fit (`offsets`: where each is, -1 for one made in memory, sent inline)."""

    def __init__(self, shared: mmap.mmap) -> None:
        self._file = np.frombuffer(shared, dtype=np.uint8)
        self._end = self._limit = 0
        self.offsets: list[int] = []

    def reset(self, start: int, size: int) -> None:
        """A new batch, its masks for the `size` bytes from `start` (a slot nobody reads)."""
        self._end, self._limit = start, start + size
        self.offsets.clear()

    def array(self, rows: int, num_words: int) -> np.ndarray:
        nbytes = rows * num_words * 4
        if self._end + nbytes > self._limit:
            self.offsets.append(-1)
            return super().array(rows, num_words)
        start, self._end = self._end, self._end + nbytes
        self.offsets.append(start)
        return self._file[start : self._end].view(np.int32).reshape(rows, num_words)

    def seal(self, array: np.ndarray) -> bytes:
        return super().seal(array) if self.offsets[-1] < 0 else b""
