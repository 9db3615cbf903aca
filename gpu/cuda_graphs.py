"""CUDA graphs for pure-decode steps: one graph per padded batch size, sharing one memory pool.

A decode step of n sequences replays the graph of the smallest captured size >= n. Padding
rows write nothing (slot -1) and attend to one token of block 0 (the pool starts zeroed), so
they stay finite and are never read back; the decode kernel starts the rows longest first
(kernels/decode_order.py), the padding last. The decode kernel gets max_seq_len = max_model_len
at capture, because a graph freezes every Python argument.
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.lora_runtime import captured_form, graph_forms, replay_form
from troupe.gpu.models import DecoderModel, KVCache
from troupe.gpu.step_inputs import StepInputs
from troupe.kernels.decode_order import longest_first


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
        self.seq_order = torch.arange(max_num_seqs, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_num_seqs + 1, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(max_num_seqs, dtype=torch.int64, device=device)
        self.model = model
        # (size, LoRA form: masked or off, gpu/lora_runtime.graph_forms)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, bool], torch.Tensor] = {}
        pool = torch.cuda.graph_pool_handle()
        captures = [
            (s, form) for s in capture_sizes(max_num_seqs) for form in graph_forms(model.lora)
        ]
        for size, form in sorted(captures, reverse=True):  # largest first: pool reuse
            meta = AttentionMetadata(
                slot_mapping=self.slot_mapping[:size],
                block_tables=self.block_tables[:size],
                seq_lens=self.seq_lens[:size],
                query_start_loc=self.query_start_loc[: size + 1],
                max_query_len=1,
                max_seq_len=max_model_len,
                is_decode=True,
                logits_indices=self.logits_indices[:size],
                decode_order=self.seq_order[:size],
            )

            def run(size: int = size, meta: AttentionMetadata = meta) -> torch.Tensor:
                hidden = model(self.input_ids[:size], self.positions[:size], meta, kv_layers)
                logits: torch.Tensor = model.compute_logits(hidden)
                return logits

            with captured_form(model.lora, form):
                run()  # warm up: kernel compilation and autotuning happen outside the capture
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size, form] = run()
            self.graphs[size, form] = graph
        torch.cuda.synchronize(device)
        self.sizes = sorted({size for size, _ in self.graphs})
        self._host = _HostStaging(max_num_seqs, max_blocks_per_seq)
        self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def can_run(self, num_seqs: int) -> bool:
        return num_seqs <= self.max_batch

    def run(self, inputs: StepInputs, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [S, vocab] (model.logits_dtype) of a pure-decode step (a view into the graph's output).

        `input_ids` (int64 on the device) replaces the leading inputs.input_ids: a copy queued
        on the stream, so it may be the output of work not finished yet.
        """
        num_seqs = len(inputs.seq_lens)
        size = next(s for s in self.sizes if s >= num_seqs)
        width = min(inputs.block_tables.shape[1], self.width)
        # one pinned staging area, reused: padding rows write nothing and read block 0
        host = self._host
        self._copied.synchronize()  # the previous step's copies have left the staging area
        host.tables[:size] = 0
        host.tables[:num_seqs, :width] = inputs.block_tables[:, :width]
        host.slots[num_seqs:size] = -1
        host.slots[:num_seqs] = inputs.slot_mapping
        host.seq_lens[num_seqs:size] = 1
        host.seq_lens[:num_seqs] = inputs.seq_lens
        host.ids[num_seqs:size] = 0
        host.ids[:num_seqs] = inputs.input_ids
        host.positions[num_seqs:size] = 0
        host.positions[:num_seqs] = inputs.positions
        host.order[:size] = longest_first(host.seq_lens[:size])
        self.input_ids[:size].copy_(host.t_ids[:size], non_blocking=True)
        self.positions[:size].copy_(host.t_positions[:size], non_blocking=True)
        self.slot_mapping[:size].copy_(host.t_slots[:size], non_blocking=True)
        self.seq_lens[:size].copy_(host.t_seq_lens[:size], non_blocking=True)
        self.seq_order[:size].copy_(host.t_order[:size], non_blocking=True)
        self.block_tables[:size].copy_(host.t_tables[:size], non_blocking=True)
        self._copied.record()
        if input_ids is not None:
            self.input_ids[: len(input_ids)].copy_(input_ids)
        form = replay_form(self.model.lora)
        self.graphs[size, form].replay()
        return self.outputs[size, form][:num_seqs]


class _HostStaging:
    """Pinned host buffers of the graph inputs, with numpy views for filling them.

    Before refilling, run() waits on an event recorded after the last copies (normally long
    done: the runner reads each step's sampled ids back before the next step).
    """

    def __init__(self, max_num_seqs: int, width: int) -> None:
        def pinned(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, pin_memory=True)

        self.t_ids = pinned(max_num_seqs, dtype=torch.int64)
        self.t_positions = pinned(max_num_seqs, dtype=torch.int64)
        self.t_slots = pinned(max_num_seqs, dtype=torch.int64)
        self.t_seq_lens = pinned(max_num_seqs, dtype=torch.int32)
        self.t_order = pinned(max_num_seqs, dtype=torch.int32)
        self.t_tables = pinned(max_num_seqs, width, dtype=torch.int32)
        self.ids = self.t_ids.numpy()
        self.positions = self.t_positions.numpy()
        self.slots = self.t_slots.numpy()
        self.seq_lens = self.t_seq_lens.numpy()
        self.order = self.t_order.numpy()
        self.tables = self.t_tables.numpy()
