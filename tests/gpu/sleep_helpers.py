"""Shared by the sleep-mode tests (tests/gpu/test_sleep_everything.py, test_sleep_mode.py): every
tensor a runner reaches, and a tiny kept-4-bit GGUF."""

from __future__ import annotations

import enum
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn
from troupe.gpu.lora_adapter import LoraAdapter
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.sampling_batch import SamplingBatches
from troupe.gpu.sleep_mode import ModelSleeper
from troupe.messages import SamplingParams, StepPlan

from tests.gpu.conftest import PlanDriver
from tests.gpu.tiny_gguf import tiny_llama_gguf

PROMPT = [(7 * j + 3) % 256 for j in range(13)]
NUM_TOKENS = 6
_LEAVES = (str, bytes, int, float, bool, type, enum.Enum, np.ndarray, np.generic, torch.dtype)


def reachable_tensors(root: object, skip: tuple[type, ...]) -> dict[str, torch.Tensor]:
    """Every tensor reachable from `root` through attributes, containers and bound methods
    (breadth first: each under its shortest path), not entering `skip` instances nor
    objects of other libraries than troupe and torch.nn."""
    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    queue: list[tuple[str, object]] = [("runner", root)]
    while queue:
        path, obj = queue.pop(0)
        if id(obj) in seen or obj is None or isinstance(obj, _LEAVES + skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found[path] = obj
        elif isinstance(obj, types.MethodType):
            queue.append((f"{path}.__self__", obj.__self__))
        elif isinstance(obj, dict):
            queue += [(f"{path}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, list | tuple | set | frozenset):
            queue += [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif type(obj).__module__.startswith("troupe.") or isinstance(obj, nn.Module):
            fields = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
            for cls in type(obj).__mro__:  # slotted records (msgspec Structs)
                fields |= {
                    s: getattr(obj, s) for s in getattr(cls, "__slots__", ()) if hasattr(obj, s)
                }
            queue += [(f"{path}.{k}", v) for k, v in fields.items()]
    return found


def held_bytes(runner: ModelRunner) -> dict[str, int]:
    """Tensors on the runner's device that it reaches and that hold bytes: not the sleeper's
    host copies nor the adapters' (host memory by design), nor the last step's sampling rows
    (a few bytes per request, not the weights')."""
    found = reachable_tensors(runner, skip=(ModelSleeper, LoraAdapter, SamplingBatches))
    on_device = (t for t in found.items() if t[1].device.type == runner.device.type)
    return {k: t.untyped_storage().nbytes() for k, t in on_device if t.untyped_storage().nbytes()}


def q4_gguf(path: Path) -> Path:
    """A tiny llama GGUF whose matrices are Q4_0 (kept 4-bit: gpu/quant_linear.Int4Linear)."""
    return tiny_llama_gguf(path, "Q4_0", intermediate_size=128, scale=0.3)


class GreedyRuns:
    """Greedy requests of PROMPT through a runner, one at a time: tokens and each step's
    proposals."""

    def __init__(self, runner: ModelRunner, num_tokens: int = NUM_TOKENS) -> None:
        self.runner = runner
        self.num_tokens = num_tokens
        self.num_requests = 0

    def __call__(self, lora: str | None = None) -> tuple[list[int], list[tuple[int, ...]]]:
        self.num_requests += 1
        rid = f"r{self.num_requests}"
        driver = PlanDriver(self.runner, chunk=len(PROMPT))
        driver.step_id = 100 * self.num_requests
        params = SamplingParams(max_tokens=self.num_tokens, temperature=0.0, lora=lora)
        driver.add(rid, PROMPT, params)
        proposals = []
        while len(driver.seqs[rid].output) < self.num_tokens:
            proposals.append(driver.step()[rid].proposals)
        self.runner.execute(StepPlan(step_id=driver.step_id + 1, seqs=(), released=(rid,)))
        return driver.seqs[rid].output, proposals
