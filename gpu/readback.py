"""Reading sampled ids back without waiting for work queued after them.

A runner that queues the next forward right after a step's draw (gpu/overlap.py, and the kept
forward after a masked step, gpu/forward_ahead.py) must copy the draw's ids to the host before
it queues that forward: a plain `.tolist()` afterwards sits behind the whole forward in the
stream, and the forward may write its logits into the graph buffer the step's own checks read.
`Readback` queues the copy at once (into pinned memory, an event after it) and `read()` waits
for that copy only.
"""

from __future__ import annotations

import torch


class Readback:
    """int64 ids on the device, copied to the host now (on CUDA: non-blocking, into pinned
    memory); `read()` waits for this copy, not for anything queued later."""

    def __init__(self, ids: torch.Tensor) -> None:
        self._event: torch.cuda.Event | None = None
        if ids.device.type == "cuda":
            self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._host.copy_(ids, non_blocking=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()
        else:
            self._host = ids.clone()  # computed already; kept from later writes to `ids`

    def read(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        out: list[int] = self._host.tolist()
        return out
