"""What one step may take, and the block arithmetic the planner does with it.

Lookahead k: a decoding request's table covers k positions past its tokens, so an executor that
overlaps the next decode step owns the block it writes (gpu/overlap.py).

    tokens  t0 .. t9 | t10 (to compute)   block_size 4, k = 1
    table   [b0 b1 b2]  covers 12 >= 11 + 1 positions: the next step's KV slot is owned
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepLimits:
    """What one step may take; each >= 1 but the lookahead (>= 0)."""

    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool = True
    num_lookahead_tokens: int = 0
    # every layer's sliding window (the widest), 0 when any layer attends to everything:
    # blocks wholly before the next query's window are released while the request runs
    kv_window: int = 0
    # The most prompt tokens one request computes in a step (0: no cap but the budget). Long
    # prompts then share steps with decodes in smaller chunks: a step's latency stays near a
    # decode's, at the price of a few more steps to the first token (vLLM's
    # long_prefill_token_threshold).
    max_chunk_tokens: int = 0
    # The most distinct LoRA adapters among the running requests (EngineConfig.max_loras when
    # lora_modules is set; 0: no limit, no adapters): each runs in one step (step_starts.py).
    max_loras: int = 0
    # The rows of one image where they attend to each other (RunnerNumbers.whole_images),
    # 0 otherwise: a prefill chunk never ends inside an image. A running or swapped request's
    # chunk ends before it (or waits a step); a waiting one starts only with room for one
    # image's rows, so the chunk after its prefix hit, cut back, is never empty
    # (plan_builder.py)
    image_rows: int = 0

    def __post_init__(self) -> None:
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_lookahead_tokens", "kv_window", "max_chunk_tokens", "max_loras",
                     "image_rows"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def chunk(self, num_tokens: int, budget: int) -> int:
        """Tokens of a `num_tokens` prefill that one step computes, within `budget`."""
        cap = self.max_chunk_tokens
        return min(num_tokens, budget, cap) if cap else min(num_tokens, budget)

    def too_big(self, num_tokens: int) -> str:
        """Why a request of num_tokens can never run here."""
        return (
            f"request needs {self.blocks_for(num_tokens)} KV blocks of {self.block_size} tokens "
            f"for its {num_tokens} tokens, but the GPU pool holds only {self.num_gpu_blocks} "
            "(num_kv_blocks)"
        )

    def lookahead(self, end: int, num_tokens: int) -> int:
        """Positions past a chunk ending at `end` its table must cover: the lookahead if the
        chunk reaches the request's `num_tokens` (it samples)."""
        return self.num_lookahead_tokens if end >= num_tokens else 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def peak_blocks(self, num_tokens: int, window: int = 0, num_sinks: int = 0) -> int:
        """The most blocks a request of num_tokens holds at once: with a window (the model's,
        or a streaming request's `window` after its `num_sinks` tokens), the sink blocks, the
        window and one step's tokens (behind it blocks are released), plus a partial block
        each side."""
        whole = self.blocks_for(num_tokens)
        window = window or self.kv_window
        if not window:
            return whole
        span = self.blocks_for(window + self.max_num_batched_tokens) + 2
        return min(whole, self.blocks_for(num_sinks) + span)

    def num_passed_blocks(self, num_computed: int, window: int = 0) -> int:
        """Leading blocks wholly before the window (the model's, or `window`) of a query at
        position num_computed."""
        return max(0, num_computed - (window or self.kv_window) + 1) // self.block_size
