"""KV blocks between the two executors of prefill/decode disaggregation, through
torch.distributed point-to-point ops (gloo on the CPU, NCCL on CUDA): one tensor per
direction per step, every layer of every block in it.

    prefill side:  send(prefill -> decode blocks)  then  recv(decode -> prefill blocks)
    decode side:   recv(prefill -> decode blocks)  then  send(decode -> prefill blocks)

Both sides take the directions in the same order, so the pair never waits on each other
crosswise. The receiver knows the shape from the plan (its `recv_blocks`): no size message.
Sends do not wait for the receiver (isend; the gathered copy is kept until it completes): the
prefill side may be steps behind (actors/core/step_join.py), and the decode side must not
wait for it to catch up just to hand over blocks it will read later. Receives wait: the step
reads what they bring.
Pools of the same geometry on both sides are what makes one block id one slot in both.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from troupe.gpu.kv_cache import KVCache
from troupe.messages import Phase, StepPlan

FLUSH_TIMEOUT = timedelta(seconds=5)
PEER_RANK = {Phase.PREFILL: 1, Phase.DECODE: 0}  # the other side's rank in the pair's group
RANK = {Phase.PREFILL: 0, Phase.DECODE: 1}


class KVTransfer:
    """One side's end of the block transfers (its pool and its peer)."""

    def __init__(self, kv: KVCache, phase: Phase) -> None:
        self.kv = kv
        self.phase = phase
        self.peer = PEER_RANK[phase]
        self.num_sent = 0
        self.num_received = 0
        self._sending: list[tuple[dist.Work, torch.Tensor]] = []  # in flight, with their data

    def apply(self, plan: StepPlan) -> None:
        """The plan's transfers, prefill -> decode first."""
        if self.phase == Phase.PREFILL:
            self._send(plan.send_blocks)
            self._recv(plan.recv_blocks)
        else:
            self._recv(plan.recv_blocks)
            self._send(plan.send_blocks)

    def _send(self, block_ids: tuple[int, ...]) -> None:
        if not block_ids:
            return
        ids = torch.tensor(block_ids, dtype=torch.int64, device=self.kv.device)
        blocks = self.kv.gpu.index_select(2, ids)  # [layers, planes, n, block, heads, dim]
        self._sending = [(w, t) for w, t in self._sending if not w.is_completed()]
        work = dist.isend(blocks, dst=self.peer)
        assert work is not None  # None only for a rank outside the group
        self._sending.append((work, blocks))
        self.num_sent += len(block_ids)

    def flush(self, timeout: timedelta = FLUSH_TIMEOUT) -> bool:
        """Wait until every send has completed (before the group is torn down); False if one
        did not within `timeout` (the peer stopped before reaching the step that receives
        it: an engine closing with prefill shares still queued)."""
        try:
            for work, _ in self._sending:
                work.wait(timeout)
        except RuntimeError:
            return False
        self._sending = []
        return True

    def _recv(self, block_ids: tuple[int, ...]) -> None:
        if not block_ids:
            return
        pool = self.kv.gpu
        shape = (*pool.shape[:2], len(block_ids), *pool.shape[3:])
        blocks = torch.empty(shape, dtype=pool.dtype, device=pool.device)
        dist.recv(blocks, src=self.peer)
        ids = torch.tensor(block_ids, dtype=torch.int64, device=pool.device)
        pool.index_copy_(2, ids, blocks)
        self.num_received += len(block_ids)
