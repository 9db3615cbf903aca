"""Integer compressed-tensors checkpoints (tests/ct_checkpoints.py) on tensor-parallel ranks
and pipeline stages: each of two ranks keeps its int4 / int8 rows (q/k/v, gate/up) and input
columns (o_proj, down_proj) equal to the reference dequantization's slices
(gpu/tp_packed_int4.py over gpu/ct_reader.CtReader); a form the kept layouts cannot hold is
refused under "keep" naming the field and expanded under "auto"; a pipeline stage expands only
its own layers (gpu/pp_weights.py); through the engine (gloo, 2 processes), 2 ranks and 2
stages stream one device's greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from ct_checkpoints import scheme, write_ct_checkpoint
from graph_helpers import collect, terminal, token_ids
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.quant_linear import Int4Linear, Int8Linear

from tests.gpu.conftest import add_word_tokenizer

CPU = torch.device("cpu")
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}
FUSED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _fused(refs: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    r = {n: refs[f"model.layers.{layer}.{n}.weight"] for n in
         ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}  # fmt: skip
    return {
        "qkv_proj": torch.cat([r[f"self_attn.{x}_proj"] for x in "qkv"]),
        "o_proj": r["self_attn.o_proj"],
        "gate_up_proj": torch.cat((r["mlp.gate_proj"], r["mlp.up_proj"])),
        "down_proj": r["mlp.down_proj"],
    }


def _rank_slices(w: dict[str, torch.Tensor], full: ModelConfig, rank: int) -> dict[str, Any]:
    """Rank `rank` of 2's part of each fused weight: rows of the column-parallel ones, input
    columns of the row-parallel ones."""
    hd, inter = full.head_dim, full.intermediate_size // 2
    nq, nk = full.num_heads * hd, full.num_kv_heads * hd
    q = slice(rank * nq // 2, (rank + 1) * nq // 2)
    k = slice(nq + rank * nk // 2, nq + (rank + 1) * nk // 2)
    v = slice(nq + nk + rank * nk // 2, nq + nk + (rank + 1) * nk // 2)
    i = slice(rank * inter, (rank + 1) * inter)
    gate, up = w["gate_up_proj"][: 2 * inter], w["gate_up_proj"][2 * inter :]
    return {
        "qkv_proj": torch.cat((w["qkv_proj"][q], w["qkv_proj"][k], w["qkv_proj"][v])),
        "gate_up_proj": torch.cat((gate[i], up[i])),
        "o_proj": w["o_proj"][:, q],
        "down_proj": w["down_proj"][:, i],
    }


TP_CASES = {  # name: (quantization_config, kept layer class, or what "keep" names)
    "w4a16-g128-sym": (scheme("pack-quantized", 4), Int4Linear),
    "w4a16-g32-asym": (scheme("pack-quantized", 4, group_size=32, symmetric=False), Int4Linear),
    "w8a16-channel-sym": (scheme("pack-quantized", 8, "channel"), Int8Linear),
    "w8a8-int-quantized": (scheme("int-quantized", 8, "channel", w8a8=True), Int8Linear),
    "w8a16-asym": (scheme("pack-quantized", 8, symmetric=False), "weights.symmetric is False"),
}


@pytest.mark.parametrize("case", list(TP_CASES))
def test_tensor_parallel_ranks_keep_the_reference_slices(case: str, tmp_path: Path, mt) -> None:
    from troupe.config import ConfigError
    from troupe.gpu.tp_group import TPGroup
    from troupe.gpu.tp_model import TPDecoderModel, TPShard
    from troupe.gpu.tp_quant import KeepShards
    from troupe.gpu.tp_weights import load_shard, open_shard_reader

    qc, kept = TP_CASES[case]
    hf_model = mt.make_hf_model("llama", tie_word_embeddings=False, **SHAPE)
    lm_head = hf_model.lm_head.weight.detach().clone()  # ignored: written dense
    refs = write_ct_checkpoint(tmp_path, hf_model, qc)
    full = ModelConfig.from_hf_folder(tmp_path)

    def rank_model(rank: int) -> TPDecoderModel:
        group = TPGroup(rank=rank, world_size=2, device=CPU)
        return TPDecoderModel(TPShard(rank=rank, size=2, full=full), group, torch.float32, CPU, 64)

    for rank in range(2):
        model = rank_model(rank)
        with open_shard_reader(tmp_path) as reader:
            if isinstance(kept, str):
                with pytest.raises(ConfigError, match=f"q_proj.*quantization 'keep': .*{kept}"):
                    load_shard(model, reader, "ct", KeepShards(strict=True))
                model = rank_model(rank)  # a fresh one for the load that passes
            load_shard(model, reader, "ct", KeepShards(strict=False))
        for layer_index, layer in enumerate(model.layers):
            want = _rank_slices(_fused(refs, layer_index), full, rank)
            for name, rows in want.items():
                weight = getattr(layer, name)
                if isinstance(kept, str):
                    assert isinstance(weight, torch.Tensor), name
                    got = weight
                else:
                    assert isinstance(weight, kept), name
                    got = weight.dequantize()
                assert torch.equal(got, rows), (rank, layer_index, name)
        nv = model.shard.num_vocab_rows
        start = model.shard.vocab_start
        assert isinstance(model.lm_head, torch.Tensor)
        assert torch.equal(model.lm_head[:nv], lm_head[start : start + nv])


@pytest.mark.parametrize("case", ["w4a16-g128-sym", "w8a8-int-quantized"])
def test_a_pipeline_stage_expands_its_own_layers(
    case: str, tmp_path: Path, mt, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 0 of 2 expands layer 0 only, stage 1 layer 1 (renumbered 0) only, each equal to
    the reference in fp32: the other stage's linears are never converted."""
    from troupe.gpu.ct_reader import CtReader
    from troupe.gpu.pp_model import PPStageModel
    from troupe.gpu.pp_stage import PPStage
    from troupe.gpu.pp_weights import load_stage
    from troupe.gpu.tp_group import TPGroup

    qc, _ = TP_CASES[case]
    hf_model = mt.make_hf_model("llama", tie_word_embeddings=False, **SHAPE)
    refs = write_ct_checkpoint(tmp_path, hf_model, qc)
    full = ModelConfig.from_hf_folder(tmp_path)
    converted: list[str] = []
    convert = CtReader.convert

    def spy(self: CtReader, prefix: str) -> Any:
        converted.append(prefix)
        return convert(self, prefix)

    monkeypatch.setattr(CtReader, "convert", spy)
    for index in range(2):
        converted.clear()
        group = TPGroup(rank=index, world_size=2, device=CPU)
        stage = PPStageModel(PPStage.of(full, index, 2, None), full, group, torch.float32, CPU, 64)
        load_stage(stage, tmp_path, full)
        assert len(stage.layers) == 1
        for param, want in _fused(refs, index).items():
            assert torch.equal(getattr(stage.layers[0], param), want), (index, param)
        assert len(converted) == 7 and all(
            p.startswith(f"model.layers.{index}.") for p in converted
        )


PROMPTS = [[(11 * i + 7 * j + 3) % 256 for j in range(5 + 3 * i)] for i in range(3)]


async def _greedy(config: Any) -> list[list[int]]:
    from troupe import Engine
    from troupe.messages import Finished, SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    out = []
    async with Engine.open(config) as engine:
        for prompt in PROMPTS:
            events = await collect(engine, prompt, params)
            assert isinstance(terminal(events), Finished), events
            out.append(token_ids(events))
    return out


def test_two_ranks_and_two_stages_stream_one_devices_tokens(tmp_path: Path, mt) -> None:
    """A W4A16 folder expanded in fp32 ("dequantize"): 2 gloo ranks, then 2 gloo stages, stream
    the greedy tokens of one device (which follow transformers on the reference weights)."""
    from troupe import EngineConfig

    hf_model = mt.make_hf_model("llama", tie_word_embeddings=False, **SHAPE)
    write_ct_checkpoint(tmp_path, hf_model, scheme("pack-quantized", 4, group_size=32))
    add_word_tokenizer(tmp_path)
    config = EngineConfig(
        model=str(tmp_path), device="cpu", dtype="float32", quantization="dequantize",
        block_size=4, num_kv_blocks=32, max_num_seqs=4, max_model_len=64,
    )  # fmt: skip
    expected = anyio.run(_greedy, config)
    assert expected[0] == mt.hf_greedy(hf_model, PROMPTS[0], 8)
    assert len({tuple(t) for t in expected}) == len(expected)  # distinct: not degenerate
    assert anyio.run(_greedy, config.replace(tensor_parallel_size=2)) == expected
    assert anyio.run(_greedy, config.replace(pipeline_parallel_size=2)) == expected
