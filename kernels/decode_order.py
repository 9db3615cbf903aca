"""The order in which the decode kernels' programs visit the sequences of a step.

The GPU starts a grid's programs in order as slots free up, so a decode step's time is set by
its last wave. A batch whose sequences differ in length (the engine's usual one: prompts of
100-1,000 tokens, each request at its own point of generation) ends with a few long sequences
started late, running alone while the other SMs idle. Visiting the sequences longest first
(the "longest processing time" rule) puts the long ones in the first wave and lets the short
ones fill the gaps of the last: on the offline workload's batches a simulation of the kernel's
programs (cost ~ length) puts the makespan at ~1.29x the ideal in batch order and ~1.09x
longest first, at the four programs per SM the bf16 kernel fits on sm_90
(`python -m troupe.ops.decode_order_sim`; docs/benchmarks.md, session 23).

The grids are (kv head, position, split): x runs fastest, so the heads of one sequence start
together and the positions follow the order. The order only changes when programs start;
every program computes what it did (the result is bit for bit the same).

This module is the host's side (numpy: the step inputs name the order); the kernels read it
through kernels/decode_program.py, so a CPU engine, which plans steps but runs no kernel, does
not import Triton.
"""

from __future__ import annotations

import numpy as np


def longest_first(seq_lens: np.ndarray, count: int | None = None) -> np.ndarray:
    """int32 [S]: the indices of the first `count` sequences (all by default: a decode step;
    a mixed step's leading decodes otherwise) by length, longest first (ties in batch order),
    then the others in batch order."""
    n = len(seq_lens) if count is None else count
    head = np.argsort(-seq_lens[:n].astype(np.int64), kind="stable")
    return np.concatenate((head, np.arange(n, len(seq_lens)))).astype(np.int32)
