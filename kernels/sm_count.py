"""How many programs a device runs at once, for the kernels that size their splits by it, and
which compute capability it has, for those that pick a form by it (asked once a device)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def num_sms(device: torch.device) -> int:
    """The device's streaming multiprocessors; 4 off CUDA (the Triton interpreter), so that
    split kernels take a few splits there and the tests cover their merge."""
    if device.type != "cuda":
        return 4
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@functools.cache
def capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability; (0, 0) off CUDA."""
    if device.type != "cuda":
        return (0, 0)
    major, minor = torch.cuda.get_device_capability(device)
    return (major, minor)
