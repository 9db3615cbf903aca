"""RunnerDead: a runner failure no later step can recover from, and the test that tells one.

Most step failures are the step's own (a bad request, a bug on one path, a failed allocation):
the executor fails that step's requests and the engine serves on. Some leave nothing to serve
with: a tensor-parallel rank that exited (gpu/tp_runner.TPWorkerError), or a CUDA error that
poisons the context (an illegal memory access, a device-side assert: every later call on the
device raises the same error). vLLM calls the result EngineDeadError; here the executor raises
RunnerDead, the engine turns dead (actors/engine_death.py) and `troupe serve` exits non-zero.
"""

from __future__ import annotations

import sys

# Message marks of errors that poison the CUDA context: torch's `CUDA error: ...` (raised as
# torch.AcceleratorError since torch 2.8, a RuntimeError before), Triton's launcher, cuBLAS's.
_POISONED = ("CUDA error", "Triton Error [CUDA]", "CUBLAS_STATUS_EXECUTION_FAILED")
# A failed allocation leaves the context usable (the caching allocator raises it before any
# kernel runs): the step fails alone.
_RECOVERABLE = ("out of memory",)


class RunnerDead(RuntimeError):
    """The runner can never step again; the message names why (it reaches every request)."""


def runner_dead(exc: BaseException) -> RunnerDead | None:
    """`exc` as a RunnerDead if no later step can succeed after it (None: the step fails
    alone). A RunnerDead is itself; a CUDA-context error is wrapped, its first line kept."""
    if isinstance(exc, RunnerDead):
        return exc
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    if any(mark in text for mark in _RECOVERABLE) or _is_out_of_memory(exc):
        return None
    if _is_accelerator_error(exc) or any(mark in first_line for mark in _POISONED):
        dead = RunnerDead(f"the CUDA context is lost: {type(exc).__name__}: {first_line}")
        dead.__cause__ = exc
        return dead
    return None


def _is_accelerator_error(exc: RuntimeError) -> bool:
    torch = sys.modules.get("torch")  # only an engine that imported torch can raise one
    return torch is not None and isinstance(exc, torch.AcceleratorError)


def _is_out_of_memory(exc: RuntimeError) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.OutOfMemoryError)
