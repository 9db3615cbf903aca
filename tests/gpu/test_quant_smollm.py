"""The default model with its weights kept as shipped (Q4_1 layers, Q8_0 embeddings) against
the same file dequantized to fp32: packed layers in place, decode logits close, argmax equal
where the reference has no near-tie."""

from __future__ import annotations

import pytest
import torch
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.quant_linear import Int4Linear, Int8Linear
from troupe.ops.quant_agreement import Stream


@pytest.mark.slow
def test_kept_weights_decode_like_the_dequantized_model() -> None:
    base = EngineConfig(device="cpu", num_kv_blocks=8, max_model_len=128, max_num_seqs=2)
    ref = ModelRunner.from_config(base.replace(quantization="dequantize"))
    quant = ModelRunner.from_config(base.replace(quantization="auto"))  # kept as shipped
    layer = quant.model.layers[0]
    assert isinstance(layer.qkv_proj, Int4Linear) and isinstance(layer.down_proj, Int4Linear)
    assert isinstance(quant.model.embed_tokens, Int8Linear)
    assert isinstance(ref.model.layers[0].qkv_proj, torch.Tensor)
    prompt = [1, 504, 3458, 282, 4649, 314]  # "The capital of France is"-like ids
    a, b = Stream(ref, "a"), Stream(quant, "b")
    ra, rb = a.feed(prompt), b.feed(prompt)
    for _ in range(4):
        token = int(ra.argmax())
        top2 = ra.topk(2).values
        if top2[0] - top2[1] > 0.5:  # not a near-tie: the kept weights pick the same token
            assert int(rb.argmax()) == token
        ra, rb = a.feed([token]), b.feed([token])
        delta = (ra - rb).abs().max()
        assert 0 < delta < 2.0  # the packed decode path ran, and stayed close
