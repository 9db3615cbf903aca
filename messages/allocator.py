"""Inbox of the Allocator: one batched request per scheduling step.

PROVISIONAL: the allocator/scheduler work owns this module and may reshape it.
"""

from __future__ import annotations

import msgspec


class AllocateBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    step_id: int


AllocatorInbox = AllocateBatch
