"""CUDA graphs for steps that carry prefill chunks: one graph per padded token count.

A step that mixes decodes with prefill chunks (or holds prefills only) launches some 15 kernels
per layer; run eagerly, the launches cost more than the GPU work. Here each token-count bucket
is captured once, whole model and lm_head, like the decode graphs (gpu/cuda_graphs.py). What
lets attention be captured is kernels/paged_attention.py: its grid depends on the token and
sequence counts only, and the decodes that lead the step (the scheduler puts them first) go to
the decode kernel through a device-side count.

A step of T tokens and S sequences replays the graph of the smallest bucket >= T, with
min(bucket, max_num_seqs) sequence slots:

    tokens     | seq 0 | seq 1 | chunk of seq 2 ........ | padding (slot -1, id 0, pos 0) |
    sequences  | 0 1 2 | padding: q_len 0 (query_start_loc = T), seq_len 1: no tiles    |
    lm_head    | the sampled rows (a verification: 1 + k each), then row 0 repeated        |
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.embed_rows import EmbedsBuffers
from troupe.gpu.lora_runtime import captured_form, graph_forms, replay_form
from troupe.gpu.models import DecoderModel, KVCache
from troupe.gpu.step_inputs import StepInputs
from troupe.kernels.decode_order import longest_first


def token_buckets(max_num_tokens: int) -> list[int]:
    """Multiples of 64 to 512, of 128 to 2,048, of 256 to 4,096, of 512 to 8,192, of 1,024
    beyond; max_num_tokens always included.

    Padding costs GEMM work in proportion: a step pads by at most a quarter of its tokens past
    512, an eighth past 2,048.
    """
    sizes = [
        *range(64, 513, 64),
        *range(640, 2049, 128),
        *range(2304, 4097, 256),
        *range(4608, 8193, 512),
        *range(9216, max_num_tokens, 1024),
    ]
    return sorted({s for s in sizes if s < max_num_tokens} | {max_num_tokens})


def bucket_rows(
    buckets: list[int], max_num_seqs: int, max_logits: int
) -> dict[int, tuple[int, ...]]:
    """The lm_head row counts captured per bucket: min(bucket, max_num_seqs), what a step
    without proposals needs (one row per sequence), and where proposals can need more rows
    (a bucket past max_num_seqs, up to the first that holds max_logits), a second graph with
    min(bucket, max_logits) rows. So a step that verifies nothing computes no more logits
    than with speculation off; a verification with more rows than its bucket has runs
    eagerly (it also carries prefill chunks: rare)."""
    top = next((b for b in buckets if b >= max_logits), buckets[-1])
    rows: dict[int, tuple[int, ...]] = {}
    for size in buckets:
        plain, spec = min(size, max_num_seqs), min(size, max_logits)
        rows[size] = (plain, spec) if spec > plain and size <= top else (plain,)
    return rows


class MixedGraphs:
    """Captured forwards (model + lm_head) of steps with prefill chunks, over static buffers."""

    def __init__(
        self,
        model: DecoderModel,
        kv_layers: list[KVCache],
        *,
        max_num_seqs: int,
        max_num_tokens: int,
        max_blocks_per_seq: int,
        max_model_len: int,
        max_logits_per_seq: int = 1,
        prompt_embeds: bool = False,
    ) -> None:
        """`max_logits_per_seq`: 1 + the proposals a sequence may carry (speculative
        decoding verifies each in its own logits row). `prompt_embeds`: the graphs take input
        embeddings (StepInputs.embeds) from buffers of their own (gpu/embed_rows.py)."""
        device = model.device
        self.max_num_seqs = max_num_seqs
        max_logits = max_num_seqs * max_logits_per_seq
        self.max_tokens = max_num_tokens
        self.width = max_blocks_per_seq
        s_max = max_num_seqs

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_num_tokens, dtype=torch.int64)
        self.positions = zeros(max_num_tokens, dtype=torch.int64)
        self.slot_mapping = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=device)
        self.block_tables = zeros(s_max, max_blocks_per_seq, dtype=torch.int32)
        self.seq_lens = torch.ones(s_max, dtype=torch.int32, device=device)
        self.query_start_loc = zeros(s_max + 1, dtype=torch.int32)
        self.logits_indices = zeros(max_logits, dtype=torch.int64)
        self.decode_prefix = zeros(1, dtype=torch.int32)
        self.decode_order = torch.arange(s_max, dtype=torch.int32, device=device)
        # one output for every bucket: a graph's own output would stay pinned in the pool
        self.logits = torch.empty(
            max_logits, model.config.vocab_size, dtype=model.logits_dtype, device=device
        )
        self.max_logits = max_logits
        self.model = model
        self.embeds = (
            EmbedsBuffers(max_num_tokens, model.config.hidden_size, model.dtype, device)
            if prompt_embeds
            else None
        )
        # (bucket, rows, LoRA form: masked or off, gpu/lora_runtime.graph_forms)
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self.rows = bucket_rows(token_buckets(max_num_tokens), s_max, max_logits)
        pool = torch.cuda.graph_pool_handle()
        captures = [
            (size, rows, form)
            for size, all_rows in self.rows.items()
            for rows in all_rows
            for form in graph_forms(model.lora)
        ]
        for size, rows, form in sorted(captures, reverse=True):  # largest first
            seqs = min(size, s_max)
            meta = AttentionMetadata(
                slot_mapping=self.slot_mapping[:size],
                block_tables=self.block_tables[:seqs],
                seq_lens=self.seq_lens[:seqs],
                query_start_loc=self.query_start_loc[: seqs + 1],
                max_query_len=size,
                max_seq_len=max_model_len,
                is_decode=False,
                logits_indices=self.logits_indices[:rows],
                decode_prefix=self.decode_prefix,
                decode_order=self.decode_order[:seqs],
            )

            def run(size: int = size, rows: int = rows, meta: AttentionMetadata = meta) -> None:
                given = None if self.embeds is None else self.embeds.rows(size)
                ids, positions = self.input_ids[:size], self.positions[:size]
                hidden = model(ids, positions, meta, kv_layers, given)
                self.logits[:rows].copy_(model.compute_logits(hidden))

            with captured_form(model.lora, form):
                run()  # warm up: compilation and autotuning happen outside the capture
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    run()
            self.graphs[size, rows, form] = graph
        torch.cuda.synchronize(device)
        self.sizes = sorted(self.rows)
        self._host = _HostStaging(max_num_tokens, s_max, max_blocks_per_seq, max_logits)
        self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def can_run(self, inputs: StepInputs) -> bool:
        num_tokens = len(inputs.input_ids)
        if (
            (inputs.embeds is not None and self.embeds is None)
            or num_tokens > self.max_tokens
            or len(inputs.seq_lens) > self.max_num_seqs
            or inputs.block_tables.shape[1] > self.width
        ):
            return False
        size = next(s for s in self.sizes if s >= num_tokens)
        return len(inputs.logits_indices) <= self.rows[size][-1]

    def run(self, inputs: StepInputs, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [sampled rows, vocab] of the step (model.logits_dtype) (a view into the shared output).
        `input_ids` (on the device) replace the leading inputs.input_ids (cuda_graphs.py)."""
        num_tokens = len(inputs.input_ids)
        num_seqs = len(inputs.seq_lens)
        num_logits = len(inputs.logits_indices)
        size = next(s for s in self.sizes if s >= num_tokens)
        seqs = min(size, self.max_num_seqs)
        rows = next(r for r in self.rows[size] if r >= num_logits)
        width = inputs.block_tables.shape[1]
        host = self._host
        self._copied.synchronize()  # the previous step's copies have left the staging area
        host.ids[:num_tokens] = inputs.input_ids
        host.ids[num_tokens:size] = 0
        host.positions[:num_tokens] = inputs.positions
        host.positions[num_tokens:size] = 0
        host.slots[:num_tokens] = inputs.slot_mapping
        host.slots[num_tokens:size] = -1
        # padding sequences own no tokens (and no tiles); their tables are never read
        host.qsl[: num_seqs + 1] = inputs.query_start_loc
        host.qsl[num_seqs + 1 : seqs + 1] = num_tokens
        host.seq_lens[:num_seqs] = inputs.seq_lens
        host.seq_lens[num_seqs:seqs] = 1
        host.tables[:num_seqs, :width] = inputs.block_tables
        host.logits_indices[:num_logits] = inputs.logits_indices
        host.logits_indices[num_logits:rows] = 0
        host.prefix[0] = inputs.num_decode_prefix
        # the leading decodes longest first, then the chunks and the padding (kernels/decode_order)
        host.order[:seqs] = longest_first(host.seq_lens[:seqs], inputs.num_decode_prefix)
        self.input_ids[:size].copy_(host.t_ids[:size], non_blocking=True)
        self.positions[:size].copy_(host.t_positions[:size], non_blocking=True)
        self.slot_mapping[:size].copy_(host.t_slots[:size], non_blocking=True)
        self.query_start_loc[: seqs + 1].copy_(host.t_qsl[: seqs + 1], non_blocking=True)
        self.seq_lens[:seqs].copy_(host.t_seq_lens[:seqs], non_blocking=True)
        self.block_tables[:num_seqs].copy_(host.t_tables[:num_seqs], non_blocking=True)
        self.logits_indices[:rows].copy_(host.t_logits_indices[:rows], non_blocking=True)
        self.decode_prefix.copy_(host.t_prefix, non_blocking=True)
        self.decode_order[:seqs].copy_(host.t_order[:seqs], non_blocking=True)
        self._copied.record()
        if input_ids is not None:
            self.input_ids[: len(input_ids)].copy_(input_ids)
        if self.embeds is not None:
            self.embeds.fill(inputs.embeds, self.model.vision)
        self.graphs[size, rows, replay_form(self.model.lora)].replay()
        return self.logits[:num_logits]


class _HostStaging:
    """Pinned host buffers of the graph inputs, with numpy views for filling them."""

    def __init__(self, max_tokens: int, max_seqs: int, width: int, max_logits: int) -> None:
        def pinned(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, pin_memory=True)

        self.t_ids = pinned(max_tokens, dtype=torch.int64)
        self.t_positions = pinned(max_tokens, dtype=torch.int64)
        self.t_slots = pinned(max_tokens, dtype=torch.int64)
        self.t_qsl = pinned(max_seqs + 1, dtype=torch.int32)
        self.t_seq_lens = pinned(max_seqs, dtype=torch.int32)
        self.t_tables = pinned(max_seqs, width, dtype=torch.int32)
        self.t_logits_indices = pinned(max_logits, dtype=torch.int64)
        self.t_prefix = pinned(1, dtype=torch.int32)
        self.t_order = pinned(max_seqs, dtype=torch.int32)
        self.ids = self.t_ids.numpy()
        self.positions = self.t_positions.numpy()
        self.slots = self.t_slots.numpy()
        self.qsl = self.t_qsl.numpy()
        self.seq_lens = self.t_seq_lens.numpy()
        self.tables = self.t_tables.numpy()
        self.logits_indices = self.t_logits_indices.numpy()
        self.prefix = self.t_prefix.numpy()
        self.order = self.t_order.numpy()
