"""Inbox of the Executor: one StepPlan per scheduling step.

The executor keeps per-request state between steps (block table, sampling params, token
history for penalties) so that plans carry deltas, not whole sequences:

    SeqWork(reset=True,  block_ids=(7, 9), start_pos=0,  token_ids=prompt[:32])  # table := [7, 9]
    SeqWork(reset=False, block_ids=(12,),  start_pos=32, token_ids=prompt[32:40]) # table += [12]
    SeqWork(reset=False, block_ids=(),     start_pos=40, token_ids=(last_sampled,))

Speculative decoding: `draft_token_ids` are proposed tokens after `token_ids` (a decode's one
token). The runner computes their KV too (k+1 query tokens), verifies them against the target
and answers the accepted ones and one more (SampledToken.more). `num_dropped_blocks` trailing
blocks leave the table first (the allocator took them back: Shrink).

`reset=True` replaces the table (first schedule, after swap-in, after recompute-preemption).
`params` is set the first time a request is scheduled; state is dropped when its id is in
`released`. Token history is indexed by position, so re-feeding tokens after a recompute
preemption rewrites the same entries.
"""

from __future__ import annotations

import msgspec
from troupe.messages.engine_calls import UpdateWeights
from troupe.messages.images import PromptImage
from troupe.messages.profile_calls import StartProfile, StopProfile
from troupe.messages.prompt_embeds import PromptEmbeds
from troupe.messages.sampling import SamplingParams
from troupe.messages.sleep_calls import Sleep, WakeUp


# gc=False: plans are built every step and hold no cycles (msgspec docs; vLLM does the same).
class SeqWork(msgspec.Struct, frozen=True, gc=False):
    """One sequence's share of a step. Build it with keywords; the plan's hot path alone
    passes the first three by position (a decode's SeqWork; keywords cost ~20% of it)."""

    request_id: str
    token_ids: tuple[int, ...]  # tokens whose KV this step computes (a prefill chunk, or 1)
    start_pos: int  # position of token_ids[0] in the sequence
    block_ids: tuple[int, ...] = ()  # GPU blocks appended to the table (the whole table if reset)
    reset: bool = False
    sample: bool = True  # sample a next token after this chunk (False mid-prompt)
    params: SamplingParams | None = None  # first schedule only
    num_prompt_tokens: int = 0  # penalties tell prompt from output tokens by position
    draft_token_ids: tuple[int, ...] = ()  # proposals to verify after token_ids (sample=True)
    num_dropped_blocks: int = 0  # trailing table blocks to drop before block_ids are appended
    # Prefill/decode disaggregation: a request that moves in from the other executor (reset)
    # brings the tokens of positions 0..start_pos-1 that executor knew, for its penalties
    history: tuple[int, ...] = ()
    # A prompt's last token, held back from its last chunk (sample=False) when the prompt joins
    # running decodes: an overlapping runner may compute and sample it with the decodes' next
    # step (gpu/overlap_merge.py), where the next plan asks for it as a decode. -1: none
    next_token: int = -1
    # SamplingParams.prompt_logprobs: the runner scores the chunk's first `num_scored` rows,
    # each one's logprob of the prompt token after it: token_ids[1:], then `after_chunk` (the
    # prompt token after the chunk, -1 when the chunk reaches the prompt's last token)
    num_scored: int = 0
    after_chunk: int = -1
    pools: bool = False  # SamplingParams.pooling: the chunk holds prompt positions to pool
    # An embeddings prompt (messages/prompt_embeds.py): the rows of the chunk's leading
    # positions (those before the prompt's end), fed in place of their token ids' embeddings
    prompt_embeds: PromptEmbeds | None = None
    # The prompt's images whose placeholders the chunk holds (in part): the runner encodes
    # each and feeds the rows of its placeholders in the chunk (messages/images.py)
    images: tuple[PromptImage, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class StepPlan(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """One step: apply `released`, then swap_out, then swap_in, then copy_blocks, then compute
    `seqs`."""

    step_id: int
    seqs: tuple[SeqWork, ...]
    swap_out: tuple[tuple[int, int], ...] = ()  # (gpu block, cpu block)
    swap_in: tuple[tuple[int, int], ...] = ()  # (cpu block, gpu block)
    released: tuple[str, ...] = ()  # requests whose executor state is dropped
    # (src, dst) device block copies, all layers (parallel sampling's copy on write of the
    # prompt's last, partial block); done before the forward pass
    copy_blocks: tuple[tuple[int, int], ...] = ()
    awaits_masks: bool = False  # a TokenMasks for this step comes from the grammar actor
    # some SeqWork needs final hidden states beyond its logits: rows to score (prompt
    # logprobs) or to pool (embeddings); such a step runs eagerly
    reads_hidden: bool = False
    # The constrained rows that sampled in step `ahead_masks_of` (the plan before) take the
    # masks the grammar filled ahead from that step's tokens (TokenMasks.ahead)
    ahead_masks_of: int | None = None
    # Prefill/decode disaggregation (actors/core/phase_router.py): KV blocks (all layers) this
    # executor sends to / receives from its peer before anything else in the step. Both sides
    # move the prefill->decode blocks first, then the decode->prefill ones (gpu/kv_transfer.py)
    send_blocks: tuple[int, ...] = ()
    recv_blocks: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def is_masked(self) -> bool:
        """Sampled under grammar masks: fresh ones for this step, ahead ones, or both."""
        return self.awaits_masks or self.ahead_masks_of is not None


class TokenMasks(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """From the Grammar actor: which tokens each constrained row of step `step_id` may sample
    (`ahead`: of the step after step `step_id`, filled from its tokens before that plan).

    `bitmask` is int32 [len(request_ids), num_words] in native byte order, bit t of word t // 32
    set when token t is allowed (xgrammar's layout). `failed` names the requests whose grammar
    broke (a token it refused, a spec that would not compile): they get no token this step.
    `dead_ends`: those of `failed` whose grammar allows no token after the text so far (the
    client's grammar, not an engine fault)."""

    step_id: int
    request_ids: tuple[str, ...]
    num_words: int
    bitmask: bytes
    failed: tuple[tuple[str, str], ...] = ()  # (request id, why)
    ahead: bool = False
    dead_ends: tuple[str, ...] = ()  # a default, so older traces still decode


# the engine's calls: messages/engine_calls.py, messages/sleep_calls.py, messages/profile_calls.py
ExecutorInbox = StepPlan | TokenMasks | UpdateWeights | Sleep | WakeUp | StartProfile | StopProfile
