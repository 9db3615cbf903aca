"""The activation peak of the biggest forward the engine runs, measured once at start-up so that
the KV pool can take the rest of the device (gpu/pool_sizing.py)."""

from __future__ import annotations

import numpy as np
import torch
from troupe.config import EngineConfig
from troupe.gpu.device_inputs import NEVER, ExpandPolicy, device_metadata
from troupe.gpu.embed_rows import ENCODE_BATCH
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.models import DecoderModel
from troupe.gpu.step_inputs import StepInputs


def profile_activation_peak(model: DecoderModel, config: EngineConfig, max_model_len: int) -> int:
    """Activation peak of a forward at max_num_batched_tokens (plus max_num_seqs logits).

    An MLA model's step expands up to mla_expand_max_tokens cached tokens to per-head K/V
    (gpu/device_inputs.ExpandPolicy): the first prompt then sits after that much cached
    context (as far as max_model_len allows), so the profile expands as much as a step may."""
    device = model.device
    block_size = config.block_size
    num_tokens = config.step_budget()
    seq_len = min(num_tokens, max_model_len)
    num_seqs = -(-num_tokens // seq_len)
    lens = [min(seq_len, num_tokens - i * seq_len) for i in range(num_seqs)]
    context = [0] * num_seqs
    policy = NEVER
    if model.config.mla is not None and config.mla_expand_min_tokens > 0:
        policy = ExpandPolicy(config.mla_expand_min_tokens, config.mla_expand_max_tokens)
        room = policy.max_tokens - sum(-(-n // block_size) * block_size for n in lens)
        context[0] = max(0, min(room, max_model_len - lens[0])) // block_size * block_size
    totals = [c + n for c, n in zip(context, lens, strict=True)]
    width = max(-(-t // block_size) for t in totals)
    scratch = KVCache(
        model.config,
        num_gpu_blocks=num_seqs * width,
        num_cpu_blocks=0,
        block_size=block_size,
        dtype=model.dtype,
        device=device,
    )
    positions = np.concatenate([np.arange(c, t) for c, t in zip(context, totals, strict=True)])
    owner = np.repeat(np.arange(num_seqs), lens)
    tables = np.arange(num_seqs * width, dtype=np.int32).reshape(num_seqs, -1)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    num_logits = min(config.max_num_seqs * (1 + config.num_proposals), num_tokens)
    inputs = StepInputs(
        input_ids=np.zeros(num_tokens, dtype=np.int64),
        positions=positions,
        slot_mapping=tables[owner, positions // block_size] * block_size + positions % block_size,
        block_tables=tables,
        seq_lens=np.asarray(totals, dtype=np.int32),
        query_start_loc=qsl,
        logits_indices=np.arange(num_tokens - num_logits, num_tokens),
        sampled_rows=np.arange(num_logits),
        max_query_len=max(lens),
        max_seq_len=max(totals),
    )
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    try:
        hidden = model(
            torch.from_numpy(inputs.input_ids).to(device),
            torch.from_numpy(positions).to(device),
            device_metadata(inputs, device, policy, block_size),
            scratch.layers,
        )
        logits = model.compute_logits(hidden)
        logits.softmax(dim=-1).sort(dim=-1)  # the sampler's biggest temporaries
        torch.cuda.synchronize(device)
    except torch.OutOfMemoryError as exc:
        raise MemoryError(
            f"out of device memory in a forward of max_num_batched_tokens={num_tokens} tokens; "
            "lower max_num_batched_tokens or max_num_seqs"
        ) from exc
    peak = torch.cuda.max_memory_allocated(device) - before
    del hidden, logits, scratch
    torch.cuda.empty_cache()
    return max(int(peak), _encoder_peak(model))


def _encoder_peak(model: DecoderModel) -> int:
    """The vision encoder's activation peak on a batch of ENCODE_BATCH images (it runs before
    the step's forward, its rows small beside the forward's activations); 0 without one."""
    vision = model.vision
    if vision is None:
        return 0
    device, size = model.device, vision.config.image_size
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    try:
        channels = vision.config.num_channels
        rows = vision(torch.zeros(ENCODE_BATCH, channels, size, size, device=device))
        torch.cuda.synchronize(device)
    except torch.OutOfMemoryError as exc:
        raise MemoryError(
            f"out of device memory encoding {ENCODE_BATCH} images of {size}x{size} pixels"
        ) from exc
    peak = torch.cuda.max_memory_allocated(device) - before
    del rows
    torch.cuda.empty_cache()
    return int(peak)
