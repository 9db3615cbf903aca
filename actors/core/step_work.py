"""The step planner's typed entries: one request's planned share of a step (Work) and how it
gets its blocks (Kind). The planner's passes make them (step_planner.py, step_starts.py, the
fork pass in sample_fork.py, a speculating decode in speculator.py); build_plan turns each into
a SeqWork with the blocks the allocator granted (plan_builder.py)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from troupe.actors.core.request_state import Request


class Kind(enum.Enum):
    RUN = "run"  # running already: a decode or a prefill chunk, growing by `need` blocks
    NEW = "new"  # AllocateNew (first start or recompute): the grant is the whole table
    SWAP_IN = "swap_in"  # back from the CPU pool: the grant is the whole table
    FORK = "fork"  # a sample forked from its parent (sample_fork.py): the grant is the table


class Work(msgspec.Struct):
    """One request's planned share of a step (the step planner's typed entry)."""

    req: Request
    num_tokens: int
    kind: Kind
    need: int = 0  # GPU blocks counted for it (Grow; the reservation of NEW and SWAP_IN)
    draft: tuple[int, ...] = ()  # proposals to verify (a decode: num_tokens = 1 + len(draft))
    num_dropped: int = 0  # trailing blocks a Shrink takes back first
    held: bool = False  # its prompt's last token waits for the next step (held_token.py)
