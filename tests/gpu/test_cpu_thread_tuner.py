"""gpu/cpu_thread_tuner.py: with cpu_kernel_threads 0 the CPU decode path times its first
steps under one thread and under all, then keeps the faster (a fake clock decides here, both
ways); the library's auto setting offers the choice, an explicit count does not; the native
decode steps give the same logits whichever count the tuner is trying."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from troupe.gpu.cpu_thread_tuner import OneRowTuner
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.kv_cache import KVCache

from tests.gpu.test_cpu_decode import BLOCK, _inputs, _model


class FakeLib:
    def __init__(self) -> None:
        self.one_row_threads = 1
        self.sets: list[int] = []

    def set_one_row_threads(self, threads: int) -> None:
        self.one_row_threads = threads
        self.sets.append(threads)


class FakeClock:
    """Each call under `threads` takes `cost[threads]` seconds of this clock."""

    def __init__(self, lib: FakeLib, cost: dict[int, float]) -> None:
        self.lib, self.cost, self.now = lib, cost, 0.0

    def __call__(self) -> float:
        return self.now

    def work(self) -> str:
        self.now += self.cost[self.lib.one_row_threads]
        return "out"


@pytest.mark.parametrize(("cost", "chosen"), [({1: 2.0, 2: 1.0}, 2), ({1: 1.0, 2: 3.0}, 1)])
def test_the_faster_count_is_kept(cost: dict[int, float], chosen: int) -> None:
    lib = FakeLib()
    clock = FakeClock(lib, cost)
    tuner = OneRowTuner(lib, (1, 2), trials=3, warm_up=1, clock=clock)
    outs = [tuner.run(clock.work) for _ in range(2 * (1 + 3))]
    assert outs == ["out"] * 8 and tuner.chosen == chosen
    assert lib.sets[:8] == [1, 2] * 4 and lib.one_row_threads == chosen  # alternated, then kept
    lib.one_row_threads = 7  # another runner reloaded the library: the choice is put back
    tuner.run(clock.work)
    assert lib.one_row_threads == chosen


def test_warm_up_calls_do_not_count() -> None:
    """A slow first call under each count (a pool waking up) does not decide."""
    lib = FakeLib()
    clock = FakeClock(lib, {1: 1.0, 2: 50.0})
    tuner = OneRowTuner(lib, (1, 2), trials=2, warm_up=1, clock=clock)
    tuner.run(clock.work)
    tuner.run(clock.work)  # count 2's warm-up: 50 s, not counted
    clock.cost[2] = 0.5
    while tuner.chosen is None:
        tuner.run(clock.work)
    assert tuner.chosen == 2


def test_auto_threads_offer_the_choice(q4lib: Any) -> None:
    threads = torch.get_num_threads()
    try:
        q4lib.set_threads(0)
        assert q4lib.one_row_choices == ((1, q4lib.threads) if q4lib.threads > 1 else ())
        q4lib.set_one_row_threads(1)
        assert q4lib.one_row_threads == 1
        q4lib.set_threads(2)  # an explicit count: no choice
        assert q4lib.one_row_choices == ()
    finally:
        torch.set_num_threads(threads)
        q4lib.set_threads(2)


def test_decode_steps_while_tuning_match_the_generic_forward(q4lib: Any) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q4lib.set_threads(0)
        model = _model(q4=q4lib)
        kv = KVCache(
            model.config, num_gpu_blocks=16, num_cpu_blocks=0, block_size=BLOCK,
            dtype=torch.float32, device=torch.device("cpu"),
        )  # fmt: skip
        forward = ForwardPass(
            model, kv, max_num_seqs=1, max_blocks_per_seq=12, max_model_len=48, use_graphs=False
        )
        fast = forward.cpu_decode
        assert fast is not None and fast.tuner is not None and fast.tuner.candidates == (1, 2)
        table = list(range(3, 15))
        tokens = [5, 17, 42, 99, 3, 250, 7]
        logits = forward(_inputs(tokens, 0, table))
        for _ in range(24):  # past the tuning's 2 x (2 + 8) steps
            tokens.append(int(logits.argmax()))
            step = _inputs(tokens[-1:], len(tokens) - 1, table)
            forward.cpu_decode = None
            want = forward(step).clone()
            forward.cpu_decode = fast
            logits = forward(step)
            torch.testing.assert_close(logits, want, rtol=0, atol=1e-5 * float(want.abs().max()))
        assert fast.tuner.chosen in (1, 2)
    finally:
        torch.set_num_threads(threads)
        q4lib.set_threads(2)
