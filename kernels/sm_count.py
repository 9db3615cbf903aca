"""How many programs a device runs at once, for the kernels that size their splits by it."""

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
