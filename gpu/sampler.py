"""Batched sampling: penalties, temperature, top-k, top-p, min-p, seeded Gumbel-max, logprobs.

Randomness is a counter-based hash of (request seed, position, token id) turned into Gumbel
noise, so a request's tokens depend only on its own seed and logits: not on the rest of the
batch, not on preemption, not on the device's RNG state. Every request has a seed (the
executor draws one for requests without).

Order per row (vLLM semantics): logit_bias, min_tokens' ban of stop tokens, bad_words and
allowed_token_ids (gpu/logit_edits.py); repetition, frequency and presence penalties; greedy
rows take the argmax here. Others: divide by temperature, top-k, top-p, then min-p, then Gumbel-max.
Logprobs follow EngineConfig.logprobs_mode (vLLM's --logprobs-mode, `_logprobs`): by default
(raw_logprobs) the log-softmax of the raw logits (no edit, penalty or temperature), as vLLM's;
processed_* give the logits the token was drawn from (`drawn_from`), *_logits the values
before the log-softmax.
On CUDA the noise and the argmax are one fused kernel (gpu/gumbel_argmax.py).

A row whose logits hold a NaN or an infinity gets no token: `withhold_non_finite` marks it on
the device, in the ids the runner reads back anyway, and `sampled_tokens` reports it failed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from types import ModuleType

import numpy as np
import torch
from troupe.config import LogprobsMode
from troupe.gpu.logit_edits import LogitEdits, apply_logit_edits
from troupe.gpu.runner import SequencesFailed
from troupe.gpu.token_bitmask import apply_token_bitmask
from troupe.messages import FailedSeq, SampledToken, SeqFailureReason, TokenLogprob

_MASK32 = 0xFFFFFFFF
WITHHELD = -1  # in read-back token ids: the row's logits were not finite (no vocabulary has -1)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer on int64 tensors holding values < 2**32.

    Multipliers are < 2**31 so products stay below 2**63: no signed overflow anywhere.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _MASK32
    return x ^ (x >> 16)


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)


def row_keys(seed: int, position: int) -> tuple[int, int]:
    """Two 32-bit keys for one (seed, position): the per-row part of the hash."""
    key = _splitmix64(seed ^ _splitmix64(position))
    return key & _MASK32, key >> 32


def _splitmix64_array(value: np.ndarray) -> np.ndarray:
    """_splitmix64 on uint64 arrays (numpy array arithmetic wraps mod 2**64, silently)."""
    value = value + np.uint64(0x9E3779B97F4A7C15)
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))  # type: ignore[no-any-return]


def row_keys_array(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """int64 [S, 2]: row_keys for each (seed, position) pair, vectorised (uint64 inputs)."""
    key = _splitmix64_array(seeds ^ _splitmix64_array(positions))
    out = np.empty((len(key), 2), dtype=np.int64)
    out[:, 0] = key & np.uint64(_MASK32)
    out[:, 1] = key >> np.uint64(32)
    return out


@functools.lru_cache(maxsize=4)
def _token_hashes(vocab_size: int, device: torch.device) -> torch.Tensor:
    """The per-token half of the hash: fixed per vocabulary, so computed once."""
    return _mix32(torch.arange(vocab_size, device=device, dtype=torch.int64) + 0x632BE5AB)


def gumbel_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[S, V] Gumbel(0, 1) noise from keys [S, 2] int64; a pure function of (key, token id).
    On the CPU the hash runs in numpy's uint32 (the same bits: uniform_cpu)."""
    if keys.device.type == "cpu":  # in place: the same values, no [S, V] temporaries
        return uniform_cpu(keys, vocab_size).log_().neg_().log_().neg_()
    return -torch.log(-torch.log(uniform_from_hash(token_hash(keys, vocab_size))))


def token_hash(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int64 [S, V]: the 32-bit hash of each (row key, token id), in torch's int64 (products
    below 2**63): the definition the CUDA kernel and uniform_cpu reproduce."""
    token = _token_hashes(vocab_size, keys.device)
    x = _mix32(token[None, :] ^ keys[:, :1])
    return _mix32((x + keys[:, 1:]) & _MASK32)


@functools.lru_cache(maxsize=4)
def _token_hashes_u32(vocab_size: int) -> np.ndarray:
    return _token_hashes(vocab_size, torch.device("cpu")).numpy().astype(np.uint32)


def _mix32_u32(x: np.ndarray) -> None:
    """_mix32 in place on uint32 (whose products wrap mod 2**32, as _mix32's mask does)."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x2C1B3C6D)
    x ^= x >> np.uint32(16)


def uniform_cpu(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """uniform_from_hash(token_hash(keys, V)) for CPU keys, bit for bit, with 4-byte lanes
    updated in place (~10x fewer bytes moved than the int64 torch form: 16 rows of a
    151,936-token vocabulary took ~110 ms a step that way)."""
    key = keys.numpy().astype(np.uint32)
    x = _token_hashes_u32(vocab_size)[None, :] ^ key[:, :1]
    _mix32_u32(x)
    x += key[:, 1:]
    _mix32_u32(x)
    x >>= np.uint32(9)
    u = x.astype(np.float32)
    u += np.float32(0.5)
    u *= np.float32(1.0 / 2**23)
    return torch.from_numpy(u)


def uniform_from_hash(x: torch.Tensor) -> torch.Tensor:
    """float32 in (0, 1) from 32-bit hashes. 23 bits: (2**23 - 0.5) / 2**23 is exact in
    float32, so both logs of the noise stay finite; with 24 bits the top value rounded to 1.0,
    whose +inf noise beat every logit (and made NaN of a grammar's -inf)."""
    return ((x >> 9).float() + 0.5) * (1.0 / 2**23)


@dataclasses.dataclass(kw_only=True)
class SamplingBatch:
    """Per-row sampling settings of one step, as device tensors."""

    temperature: torch.Tensor  # [S] f32; 0 = greedy
    top_k: torch.Tensor  # [S] int64; vocab size = off
    top_p: torch.Tensor  # [S] f32
    min_p: torch.Tensor  # [S] f32
    keys: torch.Tensor  # [S, 2] int64 from row_keys(seed, position of the sampled token)
    presence: torch.Tensor  # [S] f32
    frequency: torch.Tensor  # [S] f32
    repetition: torch.Tensor  # [S] f32
    output_counts: torch.Tensor | None = None  # [S, V] f32 counts of output tokens
    token_bitmask: torch.Tensor | None = None  # [S, ceil(V/32)] int32: grammar (token_bitmask)
    seen_mask: torch.Tensor | None = None  # [S, V] bool: in prompt or output
    logit_edits: LogitEdits | None = None  # logit_bias, min_tokens (sparse, per row)
    num_logprobs: tuple[int | None, ...] = ()
    logprobs_mode: LogprobsMode = "raw_logprobs"  # EngineConfig.logprobs_mode
    all_greedy: bool = False
    use_top_k: bool = False
    use_top_p: bool = False
    use_min_p: bool = False

    @property
    def edits_logits(self) -> bool:
        """Whether the logits change before the draw (logit_bias, min_tokens or a penalty)."""
        return (
            self.logit_edits is not None
            or self.output_counts is not None
            or self.seen_mask is not None
        )


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Repetition on prompt+output tokens; frequency and presence on output tokens."""
    if batch.seen_mask is not None:
        rep = batch.repetition[:, None]
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(batch.seen_mask, penalized, logits)
    if batch.output_counts is not None:
        counts = batch.output_counts
        logits = logits - batch.frequency[:, None] * counts
        logits = logits - batch.presence[:, None] * (counts > 0).float()
    return logits


def filter_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Temperature-scaled logits with tokens outside top-k / top-p / min-p set to -inf."""
    temperature = torch.where(batch.temperature > 0, batch.temperature, 1.0)
    logits = logits / temperature[:, None]
    if batch.use_top_k or batch.use_top_p:
        ordered, order = logits.sort(dim=-1, descending=True)
        if batch.use_top_k:
            kth = ordered.gather(1, (batch.top_k - 1).clamp(min=0)[:, None])
            ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        remove = ordered == float("-inf")
        if batch.use_top_p:
            probs = ordered.softmax(dim=-1)
            before = probs.cumsum(dim=-1) - probs  # mass of the strictly better tokens
            remove = remove | (before >= batch.top_p[:, None])
        logits = logits.masked_fill(
            torch.zeros_like(remove).scatter(1, order, remove), float("-inf")
        )
    if batch.use_min_p:
        probs = logits.softmax(dim=-1)
        floor = batch.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor, batch: SamplingBatch
) -> tuple[torch.Tensor, tuple[TokenLogprob | None, ...]]:
    """Token ids [S] (int64, on logits' device) and per-row logprobs (None where not asked)."""
    raw = logits
    fused = logits.is_cuda and _gumbel().available(logits)
    filters = batch.use_top_k or batch.use_top_p or batch.use_min_p
    if batch.edits_logits or filters or not fused:
        logits = logits.float()  # arithmetic in fp32; else the fused draw upcasts as it reads
    if batch.logit_edits is not None:
        logits = apply_logit_edits(logits, batch.logit_edits)
    logits = apply_penalties(logits, batch)
    bitmask = batch.token_bitmask
    if bitmask is not None and not (fused and not filters):  # else the draw reads the bits
        logits, bitmask = apply_token_bitmask(logits, bitmask), None
    if batch.all_greedy and bitmask is None:
        token_ids = _argmax(logits)
    elif fused:
        token_ids = _fused_draw(logits, batch, bitmask)
    else:
        noisy = filter_logits(logits, batch) + gumbel_noise(batch.keys, logits.shape[-1])
        token_ids = torch.where(batch.temperature > 0, _argmax(noisy), _argmax(logits))
    return token_ids, _logprobs(raw, logits, bitmask, token_ids, batch)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row argmax [S] int64. On the CPU through numpy: torch's CPU argmax takes ~100 us for one
    49,152-wide row here, numpy's ~5 us, with the same answer (first of equal maxima, a NaN
    wins)."""
    if logits.device.type == "cpu":
        return torch.from_numpy(logits.numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def _gumbel() -> ModuleType:
    """gpu/gumbel_argmax.py, imported on the first CUDA draw: it imports Triton, which costs
    a CPU engine ~80 MiB of RSS and ~0.2 s of start-up for nothing."""
    from troupe.gpu import gumbel_argmax

    return gumbel_argmax


def warm_up_draw(vocab_size: int, device: torch.device, dtype: torch.dtype, max_rows: int) -> None:
    """Compile the fused draw's kernels for draws of up to `max_rows` rows of `dtype` logits
    over this vocabulary where it runs (CUDA with Triton)."""
    if device.type == "cuda" and _gumbel().triton is not None:
        _gumbel().warm_up(vocab_size, device, dtype, max_rows)


def _fused_draw(
    logits: torch.Tensor, batch: SamplingBatch, bitmask: torch.Tensor | None = None
) -> torch.Tensor:
    """The same draw as the torch path through one kernel, under a grammar's `bitmask` if
    given (never with filters); filters (rare) still run in torch."""
    gumbel_argmax = _gumbel()
    if not (batch.use_top_k or batch.use_top_p or batch.use_min_p):
        fused: torch.Tensor = gumbel_argmax.gumbel_argmax(
            logits, batch.temperature, batch.keys, bitmask
        )
        return fused
    assert bitmask is None, "filters take the masked logits"
    scaled = filter_logits(logits, batch)  # already divided by the temperature
    is_random = batch.temperature > 0
    drawn = gumbel_argmax.gumbel_argmax(scaled, is_random.float(), batch.keys)
    out: torch.Tensor = torch.where(is_random, drawn, logits.argmax(dim=-1))
    return out


def _logprobs(
    raw: torch.Tensor,
    edited: torch.Tensor,
    bitmask: torch.Tensor | None,
    token_ids: torch.Tensor,
    batch: SamplingBatch,
) -> tuple[TokenLogprob | None, ...]:
    """The rows' logprobs as batch.logprobs_mode says: of the `raw` logits, or of those the
    draw read (`edited`: after edits and penalties; `bitmask`: the grammar's, if the draw read
    it rather than `edited`)."""
    wanted = batch.num_logprobs
    rows = [i for i, n in enumerate(wanted) if n is not None]
    if not rows:
        return tuple(None for _ in wanted)
    index = torch.tensor(rows, device=raw.device)
    mode = batch.logprobs_mode
    if mode in ("raw_logprobs", "raw_logits"):
        logprobs = raw.index_select(0, index).float()
    else:
        logprobs = drawn_from(edited, bitmask, batch, index)
    if mode in ("raw_logprobs", "processed_logprobs"):
        logprobs = logprobs.log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.index_select(0, index)[:, None])[:, 0].tolist()
    top_n = max(wanted[i] or 0 for i in rows)
    top_values, top_ids = logprobs.topk(top_n, dim=-1) if top_n else (logprobs[:, :0],) * 2
    values, ids = top_values.tolist(), top_ids.tolist()
    sampled = token_ids.index_select(0, index).tolist()
    out: list[TokenLogprob | None] = [None] * len(wanted)
    for j, row in enumerate(rows):
        n = wanted[row] or 0
        top = tuple(zip(ids[j][:n], values[j][:n], strict=True))
        out[row] = TokenLogprob(sampled[j], chosen[j], top)
    return tuple(out)


def drawn_from(
    edited: torch.Tensor, bitmask: torch.Tensor | None, batch: SamplingBatch, index: torch.Tensor
) -> torch.Tensor:
    """fp32 rows `index` of the logits the draw picked from (vLLM's processed logits): the
    edited logits under the grammar's mask; a random row's also divided by its temperature,
    with what top-k, top-p and min-p drop at -inf. A greedy row's take no temperature and no
    filter (its argmax read none). Row by row, so equal to the draw's own rows."""
    logits = edited.index_select(0, index).float()
    if bitmask is not None:
        logits = apply_token_bitmask(logits, bitmask.index_select(0, index))
    if batch.all_greedy:
        return logits
    rows = dataclasses.replace(
        batch,
        temperature=batch.temperature.index_select(0, index),
        top_k=batch.top_k.index_select(0, index),
        top_p=batch.top_p.index_select(0, index),
        min_p=batch.min_p.index_select(0, index),
    )  # the batch's filter flags kept: the draw ran with them
    return torch.where(rows.temperature[:, None] > 0, filter_logits(logits, rows), logits)


def withhold_non_finite(token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """`token_ids` with WITHHELD in the rows whose `logits` hold a NaN or an infinity.

    One reduction over the logits (a row sum: NaN and inf propagate through it, and finite
    logits would need magnitudes near 1e34 to overflow it in fp32) and a select over [S], both
    queued on the device: no sync. The result replaces the ids the caller reads back anyway,
    so the check costs no extra transfer. Only for reading back: never feed WITHHELD to a model.
    """
    return token_ids.masked_fill(~torch.isfinite(logits.sum(dim=-1, dtype=torch.float32)), WITHHELD)


def sampled_tokens(
    request_ids: Sequence[str],
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprob | None],
) -> tuple[SampledToken, ...]:
    """One SampledToken per row; raises SequencesFailed (with the others' tokens) if some rows
    were WITHHELD."""
    if WITHHELD not in token_ids:  # the hot path: one scan in C
        return tuple(map(SampledToken, request_ids, token_ids, logprobs))
    sampled: list[SampledToken] = []
    failed: list[FailedSeq] = []
    for rid, token, logprob in zip(request_ids, token_ids, logprobs, strict=True):
        if token == WITHHELD:
            failed.append(FailedSeq(rid, SeqFailureReason.NON_FINITE_LOGITS))
        else:
            sampled.append(SampledToken(rid, token, logprob))
    raise SequencesFailed(tuple(sampled), tuple(failed))
