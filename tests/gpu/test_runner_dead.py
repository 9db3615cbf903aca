"""Which runner errors leave nothing to serve with (RunnerDead), and the executor raising them
instead of failing one step."""

from __future__ import annotations

import pytest
import torch
from troupe.actors.core.executor import ExecutorCore
from troupe.config import EngineConfig
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import InjectedFault
from troupe.gpu.runner import SequencesFailed
from troupe.gpu.runner_dead import RunnerDead, runner_dead
from troupe.gpu.runner_wrapper import RunnerWrapper
from troupe.gpu.tp_runner import TPWorkerError
from troupe.messages import StepPlan, StepResult

ILLEGAL = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


def test_a_dead_runner_error_is_itself() -> None:
    worker = TPWorkerError("tensor-parallel worker failed: rank 1 exited with code -9")
    assert runner_dead(worker) is worker
    plain = RunnerDead("gone")
    assert runner_dead(plain) is plain


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (torch.AcceleratorError(ILLEGAL), "AcceleratorError: CUDA error: an illegal memory"),
        (RuntimeError("CUDA error: device-side assert triggered"), "device-side assert"),
        (RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"), "Triton"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"), ""),
        (torch.AcceleratorError("unspecified launch failure"), "unspecified launch failure"),
    ],
)
def test_cuda_context_errors_are_dead(exc: BaseException, shown: str) -> None:
    dead = runner_dead(exc)
    assert isinstance(dead, RunnerDead)
    assert str(dead).startswith("the CUDA context is lost: ")
    assert shown in str(dead)
    assert "\n" not in str(dead)  # the first line only: it reaches every request
    assert dead.__cause__ is exc


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
        InjectedFault("fault injected at step 2"),
        RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"),
        ValueError("CUDA error: not a RuntimeError"),
        SequencesFailed((), ()),
        KeyError("req-1"),
    ],
)
def test_other_errors_fail_their_step_only(exc: BaseException) -> None:
    assert runner_dead(exc) is None


class _Raising(RunnerWrapper):
    def __init__(self, error: Exception) -> None:
        super().__init__(FakeRunner.from_config(EngineConfig(runner="fake", num_kv_blocks=8)))
        self.error = error

    def execute(self, plan: StepPlan) -> tuple:  # type: ignore[type-arg]
        raise self.error


PLAN = StepPlan(step_id=7, seqs=())


def test_the_executor_raises_a_dead_runner_and_fails_a_step_otherwise() -> None:
    recoverable = ExecutorCore(_Raising(InjectedFault("fault injected at step 7")), lambda: 1.0)
    [(dest, result)] = recoverable.handle([PLAN])
    assert dest == "scheduler" and isinstance(result, StepResult)
    assert result.error == "InjectedFault: fault injected at step 7"

    worker = TPWorkerError("tensor-parallel worker failed: rank 1 exited with code -9")
    with pytest.raises(TPWorkerError) as info:
        ExecutorCore(_Raising(worker), lambda: 1.0).handle([PLAN])
    assert info.value is worker

    poisoned = torch.AcceleratorError(ILLEGAL)
    with pytest.raises(RunnerDead, match="illegal memory access") as dead:
        ExecutorCore(_Raising(poisoned), lambda: 1.0).handle([PLAN])
    assert dead.value.__cause__ is poisoned
