"""The one-sequence CPU decode path (gpu/cpu_decode.py) gives the generic forward's logits bit
for bit, over consecutive and scattered block tables, with torch's int4 kernel and with the
native one (gpu/cpu_q4.py), and steps aside where it does not apply."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from troupe.gpu.cpu_decode import CpuDecode
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.gguf_quant import Q4_1, from_gguf
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.models import DecoderModel
from troupe.gpu.quant_linear import Int4Linear
from troupe.gpu.step_inputs import StepInputs, StreamingInputs
from troupe.gpu.weights import build_model, qwen3_0_6b_config, random_weights

from tests.gpu.test_gguf_quant import random_blocks

BLOCK = 4
CPU = torch.device("cpu")


def _model(
    *, qk_norm: bool = False, qkv_bias: bool = False, q4: Any = None, max_positions: int = 256
) -> DecoderModel:
    """Two layers, every projection Q4_1 (N multiple of 64 rows: torch's own tiles); through
    the native kernel `q4` when given."""
    config = dataclasses.replace(
        qwen3_0_6b_config(),
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        vocab_size=320,
        qk_norm=qk_norm,
        qkv_bias=qkv_bias,
    )
    weights = random_weights(config, torch.float32, seed=0, std=0.2)
    model = build_model(config, weights.items(), torch.float32, CPU, max_positions)
    for i, layer in enumerate(model.layers):
        for j, attr in enumerate(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            n, k = getattr(layer, attr).shape
            raw = random_blocks(Q4_1, n, k, seed=10 * i + j)
            del layer._parameters[attr]
            setattr(layer, attr, Int4Linear(from_gguf(raw, Q4_1, (n, k)), CPU, q4))
    return model


def _inputs(tokens: list[int], start: int, table: list[int]) -> StepInputs:
    """One sequence's step: `tokens` at positions start.., its KV in `table`'s blocks."""
    n = len(tokens)
    positions = np.arange(start, start + n, dtype=np.int64)
    blocks = np.array(table, dtype=np.int32)
    return StepInputs(
        input_ids=np.array(tokens, dtype=np.int64),
        positions=positions,
        slot_mapping=blocks[positions // BLOCK].astype(np.int64) * BLOCK + positions % BLOCK,
        block_tables=blocks[None, : -(-(start + n) // BLOCK)],
        seq_lens=np.array([start + n], dtype=np.int32),
        query_start_loc=np.array([0, n], dtype=np.int32),
        logits_indices=np.array([n - 1], dtype=np.int64),
        sampled_rows=np.array([0], dtype=np.int64),
        max_query_len=n,
        max_seq_len=start + n,
    )


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("table", [list(range(3, 15)), [9, 2, 11, 0, 5, 7, 1, 12, 4, 6, 3, 8]])
def test_decode_logits_equal_the_generic_forward(
    table: list[int], qkv_bias: bool, native: bool, request: pytest.FixtureRequest
) -> None:
    q4 = request.getfixturevalue("q4lib") if native else None
    model = _model(qkv_bias=qkv_bias, q4=q4)
    kv = KVCache(
        model.config,
        num_gpu_blocks=16,
        num_cpu_blocks=0,
        block_size=BLOCK,
        dtype=torch.float32,
        device=CPU,
    )
    forward = ForwardPass(
        model, kv, max_num_seqs=1, max_blocks_per_seq=12, max_model_len=48, use_graphs=False
    )
    fast = forward.cpu_decode
    assert fast is not None
    assert fast.act_dtype == (torch.float32 if native else torch.bfloat16)
    prompt = [5, 17, 42, 99, 3, 250, 7]
    logits = forward(_inputs(prompt, 0, table))
    tokens = list(prompt)
    for _ in range(30):  # crosses several blocks
        tokens.append(int(logits.argmax()))
        step = _inputs(tokens[-1:], len(tokens) - 1, table)
        assert fast.fits(step)
        forward.cpu_decode = None
        want = forward(step).clone()
        forward.cpu_decode = fast
        logits = forward(step)  # rewrites the same KV slot with the same values
        if native:  # gpu/cpu_layers.c: the same arithmetic up to fp32 summation order
            assert fast.native is not None
            torch.testing.assert_close(logits, want, rtol=0, atol=1e-5 * float(want.abs().max()))
            assert int(logits.argmax()) == int(want.argmax())
        else:
            assert torch.equal(logits, want)


def test_not_built_where_it_does_not_apply() -> None:
    kv = KVCache(
        _model().config,
        num_gpu_blocks=4,
        num_cpu_blocks=0,
        block_size=BLOCK,
        dtype=torch.float32,
        device=CPU,
    )
    assert CpuDecode.build(_model(), kv) is not None
    assert CpuDecode.build(_model(qk_norm=True), kv) is None  # per-head q/k norm: generic
    dense = build_model(
        _model().config,
        random_weights(_model().config, torch.float32, 0).items(),
        torch.float32,
        CPU,
        64,
    )
    assert CpuDecode.build(dense, kv) is None  # dense fp32 weights: generic


def test_fits_one_sampling_decode_only() -> None:
    model = _model()
    kv = KVCache(
        model.config,
        num_gpu_blocks=4,
        num_cpu_blocks=0,
        block_size=BLOCK,
        dtype=torch.float32,
        device=CPU,
    )
    fast = CpuDecode.build(model, kv)
    assert fast is not None
    assert not fast.fits(_inputs([1, 2], 0, [0, 1]))  # a prefill
    step = _inputs([3], 5, [0, 1])
    assert fast.fits(step)
    assert not fast.fits(dataclasses.replace(step, sampled_rows=np.array([], dtype=np.int64)))
    assert not fast.fits(dataclasses.replace(step, slot_mapping=np.array([-1])))
    window = StreamingInputs(windows=np.array([8]), sink_tokens=np.array([4]),
                             cache_positions=np.array([12]))  # fmt: skip
    assert not fast.fits(dataclasses.replace(step, streaming=window))  # sinks + window only


def test_native_layers_on_a_long_sequence(q4lib: Any) -> None:
    """Past 1,024 positions the native attention splits its heads over the kernel's threads:
    the same logits as one thread (each head is one thread's), within 1e-5 of the generic
    path, after a prefill the generic path wrote."""
    model = _model(q4=q4lib, max_positions=1200)
    kv = KVCache(
        model.config, num_gpu_blocks=300, num_cpu_blocks=0, block_size=BLOCK,
        dtype=torch.float32, device=CPU,
    )  # fmt: skip
    forward = ForwardPass(
        model, kv, max_num_seqs=1, max_blocks_per_seq=300, max_model_len=1200, use_graphs=False
    )
    fast = forward.cpu_decode
    assert fast is not None and fast.native is not None
    table = list(range(299, -1, -1))  # scattered: every block out of order
    prompt = [(7 * i + 3) % 320 for i in range(1100)]
    forward.cpu_decode = None
    logits = forward(_inputs(prompt, 0, table))
    tokens = list(prompt)
    for _ in range(3):
        tokens.append(int(logits.argmax()))
        step = _inputs(tokens[-1:], len(tokens) - 1, table)
        forward.cpu_decode = None
        want = forward(step).clone()
        forward.cpu_decode = fast
        per_threads = []
        for threads in (1, 2):
            q4lib.set_threads(threads)
            per_threads.append(forward(step).clone())
        q4lib.set_threads(2)
        assert torch.equal(per_threads[0], per_threads[1])
        logits = per_threads[1]
        torch.testing.assert_close(logits, want, rtol=0, atol=1e-5 * float(want.abs().max()))
