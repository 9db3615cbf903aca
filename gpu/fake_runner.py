"""FakeRunner: a deterministic stand-in for the model that really models the paged KV cache.

Each KV slot stores (token id, position) and a 64-bit mix of the two; each block keeps the sum of
its slots' mixes. The next token of a sequence is a hash of everything read back through its
block table -- full blocks' sums plus the written slots of the last block -- so a lost, stale,
misplaced or wrongly swapped block changes the output (misplaced blocks also raise). Because a
correct cache holds exactly the sequence, the next token is a pure function of the sequence's
token ids and seed: `FakeRunner.reference_tokens` computes it without any cache.

Tokens fall in [100, 30000) so they decode to text and never hit EOS, except on request: a seed
of `EOS_SEED_BASE + k` makes the k-th output token (1-based) the first EOS id. A seed of
`COPY_SEED_BASE + p` makes each next token the one p positions back, read through the block
table (a text that repeats itself: what n-gram proposals match). `min_tokens` holds back stop
tokens, `allowed_token_ids` and `bad_words` move a token they forbid to the next one allowed, a
spent thinking budget forces its tag (fake_model.held_back); `logit_bias` needs logits: none.

Speculative decoding: a SeqWork's `draft_token_ids` are written after its token and checked
one by one against the next token the cache gives; the accepted ones and the first other
token answer (SampledToken.more), exactly as decoding them one step at a time would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from troupe.config import EngineConfig
from troupe.gpu.fake_model import (
    COPY_SEED_BASE,
    U64,
    fake_embedding,
    fake_logprob,
    fake_prompt_logprobs,
    held_back,
    next_tokens,
    output_read,
    reference_tokens,
    seed_of,
    slot_mix,
    steers,
)
from troupe.gpu.fake_model import EOS_SEED_BASE as EOS_SEED_BASE  # tests seed EOS with it
from troupe.gpu.runner import HiddenOutputs, RunnerStats
from troupe.gpu.token_bitmask import constrain_sampled
from troupe.messages import (
    PromptLogprobs,
    SampledToken,
    SamplingParams,
    SeqWork,
    StepPlan,
    TokenMasks,
)
from troupe.messages.pooling import Pooled

INT64_MAX = np.iinfo(np.int64).max


@dataclass(slots=True)
class _Seq:
    row: int  # its row of FakeRunner._tables (GPU block ids; the first `num_blocks` are valid)
    num_blocks: int
    logprobs: int | None
    params: SamplingParams


class _Store:
    """One pool's contents: per-slot token, position and mix; per-block mix sums.

    Slot-major (`[slot, block]`): a slot's values across blocks are contiguous, so checking
    the first position of every block a step reads is a 1-D gather."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.tok = np.full((block_size, num_blocks), -1, dtype=np.int64)
        self.pos = np.full((block_size, num_blocks), -1, dtype=np.int64)
        self.mix = np.zeros((block_size, num_blocks), dtype=U64)
        self.sum = np.zeros(num_blocks, dtype=U64)

    def copy_to(self, other: _Store, pairs: Sequence[tuple[int, int]]) -> None:
        src = np.fromiter((p[0] for p in pairs), np.int64, len(pairs))
        dst = np.fromiter((p[1] for p in pairs), np.int64, len(pairs))
        for name in ("tok", "pos", "mix"):
            getattr(other, name)[:, dst] = getattr(self, name)[:, src]
        other.sum[dst] = self.sum[src]


class FakeRunner:
    """Implements gpu.runner.Runner with numpy; a few microseconds per sequence per step."""

    def __init__(
        self,
        *,
        block_size: int = 16,
        num_gpu_blocks: int = 4096,
        num_cpu_blocks: int = 1024,
        vocab_size: int = 49152,
        max_model_len: int = 8192,
        eos_token_ids: tuple[int, ...] = (2,),
        kv_window: int = 0,
    ) -> None:
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(eos_token_ids)
        self.num_lookahead_tokens = 0  # no overlap: each step runs when its plan arrives
        self.kv_pages_on_write = False  # no pool memory at all
        self.lora = None  # it reads no adapter (a request's adapter changes nothing here)
        # > 0: the fake model reads only the blocks from its window's first one on, so the
        # scheduler may release those before (a sliding-window model's view, block-grained)
        self.kv_window = kv_window
        self.max_stream_len = 0  # the fake model has no attention to stream
        self._num_steps = 0
        self.gpu = _Store(num_gpu_blocks, block_size)
        self.cpu = _Store(num_cpu_blocks, block_size)
        self._seqs: dict[str, _Seq] = {}
        self._max_blocks = -(-max_model_len // block_size)
        # Every live sequence's block table, seed and prompt length, one row each: reading
        # the tables back is then one gather for the whole step, not one slice per sequence.
        self._tables = np.zeros((0, self._max_blocks), np.int64)
        self._seeds = np.zeros(0, np.int64)
        self._num_prompt = np.zeros(0, np.int64)
        self._min_tokens = np.zeros(0, np.int64)  # held_back runs below it (max: always)
        self._free_rows: list[int] = []
        self._num_with_logprobs = 0
        self._launched: StepPlan | None = None
        self._scores: list[PromptLogprobs] = []  # scored prompt chunks not yet taken
        self._pooled: list[Pooled] = []  # embeddings not yet taken

    @classmethod
    def from_config(cls, config: EngineConfig) -> FakeRunner:
        return cls(
            block_size=config.block_size,
            num_gpu_blocks=config.num_kv_blocks if config.num_kv_blocks is not None else 4096,
            num_cpu_blocks=config.num_cpu_blocks if config.num_cpu_blocks is not None else 1024,
            max_model_len=config.max_model_len if config.max_model_len is not None else 8192,
        )

    def close(self) -> None:
        for request_id in list(self._seqs):
            self._release(request_id)

    @property
    def num_live(self) -> int:
        """Requests whose state the runner holds (not yet released)."""
        return len(self._seqs)

    def statistics(self) -> RunnerStats:
        return RunnerStats(num_steps=self._num_steps)

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        """Apply released, swap_out, swap_in, copy_blocks, then write and read back plan.seqs."""
        self._num_steps += 1
        for request_id in plan.released:
            self._release(request_id)
        if plan.swap_out:
            self.gpu.copy_to(self.cpu, plan.swap_out)
        if plan.swap_in:
            self.cpu.copy_to(self.gpu, plan.swap_in)
        if plan.copy_blocks:  # parallel sampling's copy on write of a partial block
            self.gpu.copy_to(self.gpu, plan.copy_blocks)
        if not plan.seqs:
            return ()
        bs = self.block_size
        rows: list[int] = []  # per written token: its sequence's table row
        positions: list[int] = []
        tokens: list[int] = []
        sampled: list[_Seq] = []
        sampled_ids: list[str] = []
        ends: list[int] = []  # per sampled sequence: its tokens before any proposal
        drafts: dict[int, tuple[int, ...]] = {}  # index in `sampled` -> proposals
        states = self._seqs
        for work in plan.seqs:  # one pass; the decode path touches as little as it can
            rid = work.request_id
            seq = states.get(rid)
            if (
                seq is None
                or work.reset
                or work.block_ids
                or work.params is not None
                or work.num_dropped_blocks
            ):
                seq = self._update(rid, work)
            start = work.start_pos
            token_ids = work.token_ids
            if work.num_scored:
                self._scores.append(fake_prompt_logprobs(work, seq.params.prompt_logprobs or 0))
            if work.pools and (embedding := fake_embedding(work, seq.params)) is not None:
                self._pooled.append(embedding)
            if work.draft_token_ids:
                token_ids = token_ids + work.draft_token_ids
                drafts[len(sampled)] = work.draft_token_ids
            end = start + len(token_ids)
            if end > seq.num_blocks * bs:
                raise ValueError(
                    f"request {rid!r}: {end} tokens need {-(-end // bs)} blocks, "
                    f"its table has {seq.num_blocks}"
                )
            if len(token_ids) == 1:
                rows.append(seq.row)
                positions.append(start)
                tokens.append(token_ids[0])
            else:
                rows.extend([seq.row] * len(token_ids))
                positions.extend(range(start, end))
                tokens.extend(token_ids)
            if work.sample:
                sampled.append(seq)
                sampled_ids.append(rid)
                ends.append(end - len(work.draft_token_ids))
        pos = np.array(positions, np.int64)
        blocks = self._tables[np.array(rows, np.int64), pos // bs]
        self._write(blocks, pos, np.array(tokens, np.int64))
        if not sampled:
            return ()
        if drafts:
            return self._verify(sampled, sampled_ids, ends, drafts)
        return self._sample(sampled, sampled_ids, ends)

    def _verify(
        self,
        sampled: list[_Seq],
        sampled_ids: list[str],
        ends: list[int],
        drafts: dict[int, tuple[int, ...]],
    ) -> tuple[SampledToken, ...]:
        """Each sequence's next token after each of its proposals, accepted while they match."""
        rows: list[int] = []  # per read: its sequence's index
        read_ends: list[int] = []
        for i, end in enumerate(ends):
            num = 1 + len(drafts.get(i, ()))
            rows.extend([i] * num)
            read_ends.extend(range(end, end + num))
        got = self._sample([sampled[i] for i in rows], [sampled_ids[i] for i in rows], read_ends)
        out: list[SampledToken] = []
        j = 0
        for i in range(len(ends)):
            draft = drafts.get(i, ())
            reads = got[j : j + 1 + len(draft)]
            j += 1 + len(draft)
            accepted = 0
            while accepted < len(draft) and reads[accepted].token_id == draft[accepted]:
                accepted += 1
            first, more = reads[0], reads[1 : accepted + 1]
            out.append(
                SampledToken(
                    first.request_id,
                    first.token_id,
                    first.logprob,
                    tuple(r.token_id for r in more),
                    tuple(r.logprob for r in more),
                )
            )
        return tuple(out)

    def take_hidden_outputs(self) -> HiddenOutputs:
        out = HiddenOutputs(prompt_logprobs=tuple(self._scores), embeddings=tuple(self._pooled))
        self._scores, self._pooled = [], []
        return out

    def launch(self, plan: StepPlan) -> None:
        """Hold a plan that awaits grammar masks; finish() runs it."""
        self._launched = plan

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        """Run the held plan; a token the masks disallow becomes an allowed one."""
        plan, self._launched = self._launched, None
        if plan is None:
            return ()
        return constrain_sampled(self.execute(plan), masks, self.vocab_size)

    def _update(self, request_id: str, work: SeqWork) -> _Seq:
        seq = self._seqs.get(request_id)
        if seq is None:
            if work.params is None:
                raise ValueError(f"request {request_id!r}: first SeqWork carries no params")
            seq = _Seq(self._take_row(), 0, work.params.logprobs, work.params)
            self._seeds[seq.row] = seed_of(work.params)
            self._num_prompt[seq.row] = work.num_prompt_tokens
            self._min_tokens[seq.row] = INT64_MAX if steers(work.params) else work.params.min_tokens
            self._num_with_logprobs += seq.logprobs is not None
            self._seqs[request_id] = seq
        first = 0 if work.reset else seq.num_blocks - work.num_dropped_blocks
        if first < 0:
            raise ValueError(f"request {request_id!r}: drops more blocks than it holds")
        if first + len(work.block_ids) > self._max_blocks:
            raise ValueError(f"request {request_id!r}: table exceeds max_model_len")
        self._tables[seq.row, first : first + len(work.block_ids)] = work.block_ids
        seq.num_blocks = first + len(work.block_ids)
        return seq

    def _take_row(self) -> int:
        if not self._free_rows:  # double the rows
            old = len(self._tables)
            new = max(2 * old, 64)
            self._tables = np.concatenate(
                [self._tables, np.zeros((new - old, self._max_blocks), np.int64)]
            )
            self._seeds = np.concatenate([self._seeds, np.zeros(new - old, np.int64)])
            self._num_prompt = np.concatenate([self._num_prompt, np.zeros(new - old, np.int64)])
            self._min_tokens = np.concatenate([self._min_tokens, np.zeros(new - old, np.int64)])
            self._free_rows = list(range(new - 1, old - 1, -1))
        return self._free_rows.pop()

    def _release(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self._free_rows.append(seq.row)
            self._num_with_logprobs -= seq.logprobs is not None

    def _write(self, blocks: np.ndarray, positions: np.ndarray, tokens: np.ndarray) -> None:
        g, slots = self.gpu, positions % self.block_size
        g.mix[slots, blocks] = slot_mix(positions, tokens)
        g.pos[slots, blocks] = positions
        g.tok[slots, blocks] = tokens
        # Each written block's sum, recomputed from its slots (wraps mod 2**64; a block
        # listed twice gets the same value twice).
        g.sum[blocks] = g.mix[:, blocks].sum(axis=0, dtype=U64)

    def _sample(
        self, sampled: list[_Seq], sampled_ids: list[str], end_list: list[int]
    ) -> tuple[SampledToken, ...]:
        bs, g = self.block_size, self.gpu
        n = len(sampled)
        rows = np.fromiter((seq.row for seq in sampled), np.int64, n)
        ends = np.array(end_list, np.int64)
        num_full = ends // bs
        rem = ends - num_full * bs
        # Full blocks, read through each table: an (n, longest) matrix of block ids, masked
        # past each sequence's own count (entries there are stale but valid ids).
        width = int(num_full.max())
        full = self._tables[rows, :width]
        is_full = np.arange(width)[None, :] < num_full[:, None]
        if self.kv_window:
            first = np.maximum(ends - self.kv_window, 0) // bs
            is_full &= np.arange(width)[None, :] >= first[:, None]
        sums = np.where(is_full, g.sum[full], U64(0)).sum(axis=1, dtype=U64)
        wrong = (is_full & (g.pos[0][full] != np.arange(0, width * bs, bs)[None, :])).any(axis=1)
        # The last, partial block: only the slots written so far.
        last_index = np.minimum(num_full, self._max_blocks - 1)  # unused where rem == 0
        last = np.where(rem > 0, self._tables[rows, last_index], 0)
        written = np.arange(bs)[:, None] < rem[None, :]  # [slot, sequence]
        sums += np.where(written, g.mix[:, last], U64(0)).sum(axis=0, dtype=U64)
        expected = (num_full * bs)[None, :] + np.arange(bs)[:, None]
        wrong |= (written & (g.pos[:, last] != expected)).any(axis=0)
        if wrong.any():
            raise RuntimeError(
                "KV cache corruption: blocks hold the wrong positions for "
                + ", ".join(repr(sampled_ids[i]) for i in np.flatnonzero(wrong))
            )
        outputs = ends - self._num_prompt[rows]
        seeds = self._seeds[rows]
        eos_id = self.eos_token_ids[0]
        tokens = next_tokens(sums, ends, seeds, outputs, eos_id)
        if (seeds >= COPY_SEED_BASE).any():
            tokens = self._copied(tokens, rows, ends, seeds - COPY_SEED_BASE, sampled_ids)
        for i in np.flatnonzero(outputs < self._min_tokens[rows]).tolist():
            params = sampled[i].params
            tail = self._outputs(int(rows[i]), int(ends[i]), int(outputs[i]), params)
            tokens[i] = held_back(int(tokens[i]), int(outputs[i]), params, eos_id, tail)
        if not self._num_with_logprobs:
            return tuple(map(SampledToken, sampled_ids, tokens.tolist()))
        return tuple(
            SampledToken(
                rid, tok, fake_logprob(tok, seq.logprobs) if seq.logprobs is not None else None
            )
            for rid, seq, tok in zip(sampled_ids, sampled, tokens.tolist(), strict=True)
        )

    def _outputs(self, row: int, end: int, num_outputs: int, params: SamplingParams) -> list[int]:
        """The row's last output tokens held_back reads (fake_model.output_read)."""
        positions = np.arange(end - output_read(params, num_outputs), end)
        blocks = self._tables[row, positions // self.block_size]
        return [int(t) for t in self.gpu.tok[positions % self.block_size, blocks]]

    def _copied(
        self,
        tokens: np.ndarray,
        rows: np.ndarray,
        ends: np.ndarray,
        periods: np.ndarray,
        ids: list[str],
    ) -> np.ndarray:
        """Copy-seed rows take the token `period` positions back, read from the cache."""
        use = (periods >= 1) & (ends >= periods)
        if not use.any():
            return tokens
        bs, g = self.block_size, self.gpu
        back = np.where(use, ends - periods, 0)
        block = self._tables[rows, back // bs]
        found = g.tok[back % bs, block]
        wrong = use & (g.pos[back % bs, block] != back)
        if wrong.any():
            bad = ", ".join(repr(ids[i]) for i in np.flatnonzero(wrong))
            raise RuntimeError(f"KV cache corruption: copied slots are wrong for {bad}")
        return np.where(use, found, tokens)

    # the `n` tokens a correct cache gives after a prompt (fake_model.reference_tokens)
    reference_tokens = staticmethod(reference_tokens)
