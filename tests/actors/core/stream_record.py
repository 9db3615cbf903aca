"""What the streamer gets, per request, for tests that drive scheduler cores by hand."""

from __future__ import annotations

from troupe.messages import FinishReason, TokenBatch


class StreamRecord:
    """Each request's tokens and finish reasons, from the TokenBatches the scheduler sends."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.ends: dict[str, list[FinishReason]] = {}

    def add(self, batch: object) -> None:
        assert isinstance(batch, TokenBatch)
        for o in batch.outputs:
            self.tokens.setdefault(o.request_id, []).extend(o.token_ids)
            if o.finish_reason is not None:
                self.ends.setdefault(o.request_id, []).append(o.finish_reason)
