"""One tensor-parallel rank's view of its process group: the collectives the sharded model
and the step loop use, all through torch.distributed. A pipeline stage (gpu/pp_model.py) is a
rank of the same kind of group: its hidden states go point to point on the model group.

    model group     NCCL on CUDA, gloo on the CPU: all-reduce after the row-parallel layers
                    (o_proj, down_proj) and the vocab-parallel embedding, all-gather of the
                    vocab-parallel logits
    control group   always gloo (CPU tensors): rank 0 broadcasts each worker command (a StepPlan
                    and what the runner is asked to do with it) as msgpack bytes, so control
                    traffic never waits behind GPU work, and a dead rank 0 ends the others'
                    waits with an error instead of a hang (NCCL might hang)
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class TPGroup:
    """Rank, size and collectives of one process's tensor-parallel group."""

    def __init__(self, *, rank: int, world_size: int, device: torch.device) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._model_group: dist.ProcessGroup | None = None
        self._control_group: dist.ProcessGroup | None = None

    @classmethod
    def init(cls, *, rank: int, world_size: int, device: torch.device, init_file: str) -> TPGroup:
        """Join the group through a file store (no port to pick, no race for one)."""
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            # a step may legitimately take long (a big prefill); a dead peer is found by the
            # driver through the process sentinels, not by this timeout
            timeout=timedelta(hours=1),
        )
        group = cls(rank=rank, world_size=world_size, device=device)
        group._model_group = dist.group.WORLD
        group._control_group = (
            dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
        )
        # NCCL creates its communicator at the first collective: make that now, not inside a
        # CUDA graph capture (the runner captures its graphs before any step)
        group.all_reduce(torch.zeros(1, device=device))
        return group

    @property
    def is_driver_rank(self) -> bool:
        """Rank 0 talks to the engine process; the others follow its broadcasts."""
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place (partial sums of a row-parallel matmul)."""
        if self.world_size > 1:
            dist.all_reduce(tensor, group=self._model_group)
        return tensor

    def all_gather_columns(self, tensor: torch.Tensor) -> torch.Tensor:
        """[N, C] on each rank -> [N, world_size * C], rank order (vocab shards of logits)."""
        if self.world_size == 1:
            return tensor
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor, group=self._model_group)
        return torch.cat(parts, dim=1)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Point to point on the model group (a pipeline stage's hidden states to the next)."""
        dist.send(tensor.contiguous(), dst, group=self._model_group)

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Fill `tensor` from rank `src` on the model group; returns it."""
        dist.recv(tensor, src, group=self._model_group)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Rank `src`'s `tensor` on every rank, in place, on the model group (the last
        pipeline stage's logits)."""
        if self.world_size > 1:
            dist.broadcast(tensor, src, group=self._model_group)
        return tensor

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        """Rank `src`'s `data` on every rank (the others pass None) over the control group."""
        size = torch.tensor([0 if data is None else len(data)], dtype=torch.int64)
        dist.broadcast(size, src, group=self._control_group)
        if data is not None:
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buffer = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buffer, src, group=self._control_group)
        return data if data is not None else buffer.numpy().tobytes()

    def min_int(self, value: int) -> int:
        """The smallest `value` over the ranks (pool sizes: every rank holds the same blocks)."""
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self._control_group)
        return int(tensor.item())

    def barrier(self) -> None:
        dist.barrier(group=self._control_group)

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
