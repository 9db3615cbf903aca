"""Which executor holds the latest contents of each KV block (prefill/decode disaggregation).

Both executors have a pool of the same geometry and the allocator's block ids name the same
slot in both, so one block id can hold different bytes on each side. A block's contents are
valid where they were last written, or copied to since:

    prefill writes block 7      7: {prefill}
    decode reads 7              transfer prefill -> decode first; 7: {prefill, decode}
    decode writes 7             7: {decode}        (the prefill side's copy is stale)
    prefill reads 7 (a prefix-cache hit on decode's tokens): decode -> prefill

A block never written holds nothing anywhere: reading it is a bug, and `missing` says so.
Frees are not tracked: a freed block keeps its contents (the prefix cache reuses them), and a
block handed out fresh is written before anyone reads it.
"""

from __future__ import annotations

from collections.abc import Iterable

from troupe.messages.phase_router import Phase

_BIT = {Phase.PREFILL: 1, Phase.DECODE: 2}


class KVResidency:
    """Block id -> the executors holding its latest contents."""

    def __init__(self) -> None:
        self._held: dict[int, int] = {}  # block id -> bits of _BIT

    def holds(self, phase: Phase, block_id: int) -> bool:
        return bool(self._held.get(block_id, 0) & _BIT[phase])

    def missing(self, phase: Phase, block_ids: Iterable[int]) -> list[int]:
        """The blocks `phase` must receive before it reads `block_ids` (in order, once each).

        Raises AssertionError for a block no executor holds (it was never written)."""
        bit, out, seen = _BIT[phase], [], set()
        for block_id in block_ids:
            held = self._held.get(block_id, 0)
            if held & bit or block_id in seen:
                continue
            assert held, f"block {block_id} is read on the {phase} side but was never written"
            seen.add(block_id)
            out.append(block_id)
        return out

    def copied(self, phase: Phase, block_ids: Iterable[int]) -> None:
        """`phase` received these blocks: it holds them too."""
        bit = _BIT[phase]
        for block_id in block_ids:
            self._held[block_id] = self._held.get(block_id, 0) | bit

    def written(self, phase: Phase, block_ids: Iterable[int]) -> None:
        """`phase` wrote these blocks: only it holds their latest contents."""
        bit = _BIT[phase]
        for block_id in block_ids:
            self._held[block_id] = bit

    def snapshot(self) -> dict[int, frozenset[Phase]]:
        """Every block's holders (tests, diagnostics)."""
        return {
            block_id: frozenset(p for p, bit in _BIT.items() if held & bit)
            for block_id, held in self._held.items()
        }
