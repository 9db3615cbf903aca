"""CUDA graphs for pure-decode steps: one graph per padded batch size, sharing one memory pool.

A decode step of n sequences replays the graph of the smallest captured size >= n. Padding
rows write nothing (slot -1) and attend to one token of block 0 (the pool starts zeroed), so
they stay finite and are never read back. The decode kernel gets max_seq_len = max_model_len
at capture, because a graph freezes every Python argument.
"""

from __future__ import annotations

import numpy as np
import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.models import DecoderModel, KVCache
from troupe.gpu.step_inputs import StepInputs


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16 up to max_num_seqs (always included)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 16))
    return [*sizes, max_num_seqs]


class DecodeGraphs:
    """Captured decode forwards (model + lm_head) over static input buffers."""

    def __init__(
        self,
        model: DecoderModel,
        kv_layers: list[KVCache],
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        max_model_len: int,
    ) -> None:
        device = model.device
        self.max_batch = max_num_seqs
        self.width = max_blocks_per_seq

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_num_seqs, dtype=torch.int64)
        self.positions = zeros(max_num_seqs, dtype=torch.int64)
        self.slot_mapping = torch.full((max_num_seqs,), -1, dtype=torch.int64, device=device)
        self.block_tables = zeros(max_num_seqs, max_blocks_per_seq, dtype=torch.int32)
        self.seq_lens = torch.ones(max_num_seqs, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_num_seqs + 1, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(max_num_seqs, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = torch.cuda.graph_pool_handle()
        for size in sorted(capture_sizes(max_num_seqs), reverse=True):  # largest first: pool reuse
            meta = AttentionMetadata(
                slot_mapping=self.slot_mapping[:size],
                block_tables=self.block_tables[:size],
                seq_lens=self.seq_lens[:size],
                query_start_loc=self.query_start_loc[: size + 1],
                max_query_len=1,
                max_seq_len=max_model_len,
                is_decode=True,
                logits_indices=self.logits_indices[:size],
            )

            def run(size: int = size, meta: AttentionMetadata = meta) -> torch.Tensor:
                hidden = model(self.input_ids[:size], self.positions[:size], meta, kv_layers)
                logits: torch.Tensor = model.compute_logits(hidden)
                return logits

            run()  # warm up: kernel compilation and autotuning happen outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = run()
            self.graphs[size] = graph
        torch.cuda.synchronize(device)
        self.sizes = sorted(self.graphs)

    def can_run(self, num_seqs: int) -> bool:
        return num_seqs <= self.max_batch

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """fp32 logits [S, vocab] of a pure-decode step (a view into the graph's output)."""
        num_seqs = len(inputs.seq_lens)
        size = next(s for s in self.sizes if s >= num_seqs)
        width = min(inputs.block_tables.shape[1], self.width)
        host_tables = np.zeros((size, self.width), dtype=np.int32)
        host_tables[:num_seqs, :width] = inputs.block_tables[:, :width]
        slots = np.full(size, -1, dtype=np.int64)
        slots[:num_seqs] = inputs.slot_mapping
        seq_lens = np.ones(size, dtype=np.int32)
        seq_lens[:num_seqs] = inputs.seq_lens
        ids = np.zeros(size, dtype=np.int64)
        ids[:num_seqs] = inputs.input_ids
        positions = np.zeros(size, dtype=np.int64)
        positions[:num_seqs] = inputs.positions
        self.input_ids[:size].copy_(torch.from_numpy(ids), non_blocking=True)
        self.positions[:size].copy_(torch.from_numpy(positions), non_blocking=True)
        self.slot_mapping[:size].copy_(torch.from_numpy(slots), non_blocking=True)
        self.seq_lens[:size].copy_(torch.from_numpy(seq_lens), non_blocking=True)
        self.block_tables[:size].copy_(torch.from_numpy(host_tables), non_blocking=True)
        self.graphs[size].replay()
        return self.outputs[size][:num_seqs]
