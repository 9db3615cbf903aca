"""The grammar core in a child process (EngineConfig.grammar_worker="process") answers every
batch exactly as the in-thread GrammarCore does, through the shared file and inline alike, and
a dead child fails the actor with a clear error. The default model's tokenizer, no model."""

from __future__ import annotations

import gc
import multiprocessing
import random

import pytest
from troupe import Engine, EngineConfig
from troupe.actors.core.grammar import GrammarCore
from troupe.actors.core.grammar_compiler import grammar_compiler_for, grammar_vocab
from troupe.actors.grammar_process import GrammarProcess
from troupe.actors.graph import load_tokenizer_for
from troupe.config import ConfigError
from troupe.gpu.token_bitmask import allowed_ids, mask_array
from troupe.messages import (
    ComputeMasks,
    GrammarRow,
    GrammarTokens,
    StructuredOutputs,
    TokenMasks,
)
from troupe.ops.json_schemas import make_schemas

VOCAB = 49152


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return load_tokenizer_for(None)


def _process(tok, max_rows: int) -> GrammarProcess:  # type: ignore[no-untyped-def]
    return GrammarProcess(
        grammar_vocab(tok, VOCAB),
        vocab_size=VOCAB,
        eos_token_ids=tok.eos_token_ids,
        timeout_s=30.0,
        max_threads=2,
        max_rows=max_rows,
    )


def _masks(out: list[tuple[str, object]]) -> list[TokenMasks]:
    assert all(dest == "executor" for dest, _ in out)
    return [m for _, m in out if isinstance(m, TokenMasks)]


def test_process_answers_as_the_thread_core_then_fails_when_killed(tok) -> None:  # type: ignore[no-untyped-def]
    """The shared file holds 4 rows (max_rows 2): the first step's 5 go inline, later ones
    through the file."""
    specs = [StructuredOutputs.from_schema(s) for s in make_schemas(3)]
    specs.append(StructuredOutputs(regex="[a-c]{3,6}"))
    specs.append(StructuredOutputs(choice=("yes", "no")))
    ids = [f"r{i}" for i in range(len(specs))]
    core = GrammarCore(grammar_compiler_for(tok, VOCAB, tok.eos_token_ids, 30.0), max_threads=2)
    remote = _process(tok, 2)
    rng = random.Random(0)
    batch: list[ComputeMasks | GrammarTokens] = [
        ComputeMasks(
            step_id=0, rows=tuple(GrammarRow(r, s) for r, s in zip(ids, specs, strict=True))
        )
    ]
    try:
        for step in range(1, 12):
            want = _masks(core.handle(batch))
            got = _masks(remote.handle(batch))
            assert got == want, f"step {step}"
            picks = {}
            for masks in want:  # a fresh row's mask wins over its ahead one
                failed = {rid for rid, _ in masks.failed}
                rows = mask_array(masks)
                for i, rid in enumerate(masks.request_ids):
                    allowed = allowed_ids(rows[i], VOCAB)
                    if rid not in failed and len(allowed):
                        picks[rid] = int(rng.choice(allowed.tolist()))
            if not picks:
                break
            tokens = GrammarTokens(
                step_id=step, request_ids=tuple(picks), token_ids=tuple(picks.values())
            )
            # a later step: tokens, a request released, one back from a preemption (a fresh row)
            back = next(iter(picks))
            batch = [tokens]
            if step % 3 == 0:
                batch.append(ComputeMasks(step_id=step + 1, rows=(GrammarRow(back),)))
            if step == 5:
                batch.append(ComputeMasks(step_id=step + 1, released=(ids[0],)))
        assert step > 5, "the walk ended early: the test did not cover what it says"
        remote._process.kill()
        remote._process.join()
        with pytest.raises(RuntimeError, match="grammar process stopped"):
            remote.handle([ComputeMasks(step_id=99, rows=(GrammarRow("z", specs[0]),))])
    finally:
        remote.close()


def test_grammar_worker_is_checked() -> None:
    with pytest.raises(ConfigError, match="grammar_worker"):
        EngineConfig(grammar_worker="fork")  # type: ignore[arg-type]


def test_releases_alone_wait_for_the_next_batch(tok) -> None:  # type: ignore[no-untyped-def]
    """A batch of releases asks nothing: no round trip; it goes first in the next one, so the
    child drops the matcher before the rows after it, as the thread core does."""
    spec = StructuredOutputs(choice=("yes", "no"))

    def thread_core() -> GrammarCore:
        return GrammarCore(grammar_compiler_for(tok, VOCAB, tok.eos_token_ids, 30.0), max_threads=2)

    core, kept = thread_core(), thread_core()  # `kept` never sees the release
    remote = _process(tok, 4)
    sends = []
    try:
        send = remote._conn.send_bytes
        remote._conn.send_bytes = lambda data: (sends.append(data), send(data))  # type: ignore[method-assign]
        first = [ComputeMasks(step_id=0, rows=(GrammarRow("a", spec), GrammarRow("b", spec)))]
        want = _masks(core.handle(first))
        kept.handle(first)
        assert _masks(remote.handle(first)) == want
        token = int(allowed_ids(mask_array(want[0])[0], VOCAB)[0])  # a's first allowed token
        tokens = [GrammarTokens(step_id=1, request_ids=("a",), token_ids=(token,))]
        kept.handle(tokens)
        assert _masks(remote.handle(tokens)) == _masks(core.handle(tokens))
        released = [ComputeMasks(step_id=2, released=("a",))]
        assert remote.handle(released) == [] and len(sends) == 2
        core.handle(released)
        # "a" again: the release went first, so a fresh matcher, not the one past `token`
        again = [ComputeMasks(step_id=3, rows=(GrammarRow("a", spec),))]
        got, want = _masks(remote.handle(again)), _masks(core.handle(again))
        assert got == want and len(sends) == 3
        assert _masks(kept.handle(again)) != want  # what a lost release would have answered
    finally:
        remote.close()


def test_held_masks_keep_their_bits_while_later_batches_fill_the_file(tok) -> None:  # type: ignore[no-untyped-def]
    """A TokenMasks' bits are a view of the shared file: its slot is not filled again while
    the message (or anything made from its bits) lives. Every answer is held here, so the
    slots run out and the later masks come inline; each held one still equals what the thread
    core answered at its step."""
    spec = StructuredOutputs(regex="[a-z]{2,400}")
    core = GrammarCore(grammar_compiler_for(tok, VOCAB, tok.eos_token_ids, 30.0), max_threads=2)
    remote = _process(tok, 2)
    held: list[tuple[TokenMasks, bytes]] = []
    batch: list[ComputeMasks | GrammarTokens] = [
        ComputeMasks(step_id=0, rows=(GrammarRow("a", spec), GrammarRow("b", spec)))
    ]
    try:
        for step in range(1, 9):
            want = _masks(core.handle(batch))
            got = _masks(remote.handle(batch))
            assert got == want, f"step {step}"
            held += [(m, bytes(w.bitmask)) for m, w in zip(got, want, strict=True)]
            rows = mask_array(want[-1])
            allowed = [allowed_ids(rows[i], VOCAB) for i in range(2)]
            picks = [int(next(t for t in a if t not in tok.eos_token_ids)) for a in allowed]
            batch = [GrammarTokens(step_id=step, request_ids=("a", "b"), token_ids=tuple(picks))]
        kinds = [isinstance(m.bitmask, memoryview) for m, _ in held]
        assert kinds[:4] == [True] * 4 and not any(kinds[4:]), kinds  # 4 slots, then inline
        assert all(bytes(m.bitmask) == bits for m, bits in held)
        del held[:2]  # the first slot's masks go: it is filled again
        got = _masks(remote.handle(batch))
        assert isinstance(got[0].bitmask, memoryview) and got == _masks(core.handle(batch))
        assert all(bytes(m.bitmask) == bits for m, bits in held)
    finally:
        remote.close()


@pytest.mark.gpu
def test_on_cuda_the_masks_are_page_locked_views_uploaded_as_laid_on_the_host() -> None:
    """With `pin` (what build_grammar gives on CUDA) the shared file is page-locked: each
    TokenMasks' bits are a pinned view, and BitmaskUpload lays its rows out on the device as
    step_bitmask does on the host, in the masks' order and in another. A byte vocabulary (the
    GPU machine has no tokenizer files)."""
    import torch
    from troupe.gpu.pinned_host import is_pinned, pin_host_buffer
    from troupe.gpu.token_bitmask import BitmaskUpload, step_bitmask

    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    vocab = [bytes([b]) for b in range(256)] + [b"yes", b"no", b"maybe", b"</s>"]
    remote = GrammarProcess(
        vocab, vocab_size=len(vocab), eos_token_ids=(len(vocab) - 1,), timeout_s=30.0,
        max_threads=2, max_rows=4, pin=pin_host_buffer,
    )  # fmt: skip
    spec = StructuredOutputs(choice=("yes", "no", "maybe"))
    try:
        rows = tuple(GrammarRow(r, spec) for r in ("a", "b", "c"))
        (masks,) = _masks(remote.handle([ComputeMasks(step_id=0, rows=rows)]))
        assert isinstance(masks.bitmask, memoryview) and is_pinned(mask_array(masks))
        assert set(allowed_ids(mask_array(masks)[0], len(vocab)).tolist()) >= {256, 257, 258}
        upload = BitmaskUpload(torch.device("cuda"))
        for order in (["a", "b", "c"], ["c", "x", "a"]):
            got = upload.for_rows(masks, order).cpu().numpy()
            assert got.tolist() == step_bitmask(masks, order).tolist()
    finally:
        remote.close()
    assert not is_pinned(mask_array(masks))


def test_the_mask_file_leaves_a_full_dev_shm_for_the_temporary_directory(  # type: ignore[no-untyped-def]
    monkeypatch, tmp_path
) -> None:
    """/dev/shm without the room (its pages are reserved up front, so this shows at once, not
    as a SIGBUS in the child): the file goes to the temporary directory, none is left behind in
    /dev/shm; no room anywhere: a clear error. A directory of the test's stands for /dev/shm."""
    import errno
    import os
    import tempfile

    from troupe.actors import grammar_process

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(grammar_process, "SHM", str(shm))
    reserve = os.posix_fallocate

    def shm_full(fd: int, offset: int, size: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(shm)):
            raise OSError(errno.ENOSPC, "No space left on device")
        reserve(fd, offset, size)

    monkeypatch.setattr(os, "posix_fallocate", shm_full)
    shared, path = grammar_process._shared_file(1 << 20)
    try:
        assert path.startswith(tempfile.gettempdir()) and len(shared) == 1 << 20
        assert not path.startswith(str(shm)) and not list(shm.iterdir())
    finally:
        os.unlink(path)

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(RuntimeError, match="no room for the grammar's 1 MiB mask file"):
        grammar_process._shared_file(1 << 20)
    assert not list(shm.iterdir())


def _grammar_children() -> set[int | None]:
    return {p.pid for p in multiprocessing.active_children() if p.name == "troupe-grammar"}


@pytest.mark.anyio
async def test_the_engine_stops_its_grammar_process_when_it_closes() -> None:
    """Closed with the engine, not left to the collector: on CUDA the child's mask file is
    page-locked, and unregistered by a collection during another engine's CUDA-graph capture,
    it invalidated that capture (tests/gpu opens engines one after another)."""
    config = EngineConfig(runner="fake", num_kv_blocks=64, grammar_worker="process")
    gc.disable()  # the finalizer must not be what stops it
    try:
        before = _grammar_children()  # another test's, not yet collected
        async with Engine.open(config) as engine:
            assert len(_grammar_children() - before) == 1
        assert _grammar_children() - before == set()
        del engine
    finally:
        gc.enable()
