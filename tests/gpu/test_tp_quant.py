"""Quantized shards under tensor parallelism (gpu/tp_quant.py), on the CPU: the default SmolLM2
GGUF (Q4_1, Q8_0 embeddings) read per rank as its quant blocks equals the one-process kept
weights' rows and columns; each rank's model holds packed layers, not dense ones; a cut off a
block edge is refused under quantization="keep" (naming the tensor, the cut and the block) and
expanded under "auto"; through the engine, SmolLM2 kept as shipped at tensor_parallel_size=3
(its 9 heads and 3 KV heads split in 3) generates TP=1's greedy tokens with logprobs within
1e-3; a tiny fp8 checkpoint (block and per-channel scales) at TP=2 generates TP=1's tokens,
and its kept slices carry the scales vLLM's rules keep."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids
from troupe import Engine, EngineConfig
from troupe.config import ConfigError, default_model_path
from troupe.gpu.cpu_q4lib import Q4Options, load_q4
from troupe.gpu.fp8_weights import read_fp8_weights
from troupe.gpu.gguf_weights import read_gguf_config
from troupe.gpu.quant_linear import Int4Linear, Int8Linear
from troupe.gpu.tp_group import TPGroup
from troupe.gpu.tp_model import TPDecoderModel, TPShard
from troupe.gpu.tp_quant import KeepShards
from troupe.gpu.tp_weights import GGUFShardReader, SafetensorsShardReader, load_shard
from troupe.gpu.weights import load_model
from troupe.messages import Finished, SamplingParams

from tests.gpu.test_fp8_weights import fp8_folder
from tests.gpu.tiny_gguf import tiny_llama_gguf

CPU = torch.device("cpu")
PROMPTS = [[1, 504, 3458, 314, 253, 1345, 28], [4541, 42, 9, 337, 1064], [16, 17, 18, 19]]
MAX_TOKENS = 8


def _smollm2() -> Path:
    try:
        return default_model_path()
    except ConfigError:
        pytest.skip("the default model package is not installed")


@pytest.fixture(scope="module")
def kept_whole() -> Any:
    """The one-process model with SmolLM2's weights kept as shipped."""
    _, model = load_model(_smollm2(), torch.float32, CPU, 64, quantization="keep")
    return model


def test_each_rank_keeps_its_blocks(kept_whole: Any) -> None:
    path = _smollm2()
    full = read_gguf_config(path)
    reader = GGUFShardReader(path, full)
    hd, inter = full.head_dim, full.intermediate_size // 3
    keep = KeepShards(q4=load_q4(Q4Options()), strict=True)  # the native kernel, if it runs here
    x = torch.randn(4, full.intermediate_size, generator=torch.Generator().manual_seed(0))
    partial_sum = torch.zeros(4, full.hidden_size)
    for rank in range(3):
        shard = TPShard(rank=rank, size=3, full=full)
        group = TPGroup(rank=rank, world_size=3, device=CPU)  # no collective is called
        model = TPDecoderModel(shard, group, torch.float32, CPU, 64)
        load_shard(model, reader, str(path), keep)
        whole_layer, layer = kept_whole.layers[5], model.layers[5]
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            assert isinstance(getattr(layer, name), Int4Linear), name  # Q4_1, kept
        assert isinstance(model.embed_tokens, Int8Linear)  # Q8_0, tied lm_head
        q = slice(rank * 3 * hd, (rank + 1) * 3 * hd)
        qkv = whole_layer.qkv_proj.dequantize()
        nq, nk = full.num_heads * hd, full.num_kv_heads * hd
        k = slice(nq + rank * hd, nq + (rank + 1) * hd)
        v = slice(nq + nk + rank * hd, nq + nk + (rank + 1) * hd)
        assert torch.equal(layer.qkv_proj.dequantize(), torch.cat((qkv[q], qkv[k], qkv[v])))
        assert torch.equal(layer.o_proj.dequantize(), whole_layer.o_proj.dequantize()[:, q])
        i = slice(rank * inter, (rank + 1) * inter)
        gate_up = whole_layer.gate_up_proj.dequantize()
        want = torch.cat((gate_up[i], gate_up[full.intermediate_size :][i]))
        assert torch.equal(layer.gate_up_proj.dequantize(), want)
        assert torch.equal(layer.down_proj.dequantize(), whole_layer.down_proj.dequantize()[:, i])
        partial_sum += layer.down_proj(x[:, i])  # what the all-reduce adds up
        rows = torch.arange(rank * 16384, (rank + 1) * 16384)
        got = model.embed_tokens.embedding(torch.arange(16384))
        assert torch.equal(got, kept_whole.embed_tokens.embedding(rows))
    # a row cut's groups are the whole weight's groups: the same products, summed in another order
    whole = kept_whole.layers[5].down_proj(x)
    torch.testing.assert_close(partial_sum, whole, rtol=0, atol=1e-5 * whole.abs().max().item())


def test_a_cut_off_a_block_edge_is_refused_or_expanded() -> None:
    path = _smollm2()
    reader = GGUFShardReader(path, read_gguf_config(path))
    name = "model.layers.1.mlp.down_proj.weight"
    with pytest.raises(ConfigError, match=r"down_proj.*columns \[10, 50\).*Q4_1 block edge \(32"):
        reader.read_kept(name, 1, 10, 50, strict=True)
    assert reader.read_kept(name, 1, 10, 50, strict=False) is None  # "auto": the dense read
    assert reader.read_kept(name, 1, 32, 64, strict=True) is not None
    assert reader.read_kept("model.layers.1.input_layernorm.weight", None, 0, 0, True) is None


def _config(model: str | None, **changes: Any) -> EngineConfig:
    settings: dict[str, Any] = {
        "model": model,
        "device": "cpu",
        "dtype": "float32",
        "block_size": 4,
        "num_kv_blocks": 64,
        "max_num_seqs": 4,
        "max_model_len": 64,
        "quantization": "keep",
    }
    return EngineConfig(**(settings | changes))


Generated = tuple[list[int], list[float], list[float]]  # tokens, their logprobs, top-2 margins


async def _generate(config: EngineConfig, vocab: int = 49152) -> list[Generated]:
    out: dict[int, Generated] = {}

    async def one(engine: Engine, i: int) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)
        events = await collect(engine, [t % vocab for t in PROMPTS[i]], params)
        assert isinstance(terminal(events), Finished), events
        rows = [e for ev in events for e in (ev.logprobs or ())]
        margins = [row.top[0][1] - row.top[1][1] for row in rows]
        out[i] = (token_ids(events), [row.logprob for row in rows], margins)

    async with Engine.open(config) as engine:
        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, engine, i)
    return [out[i] for i in range(len(PROMPTS))]


def _same(got: list[Generated], want: list[Generated], atol: float) -> None:
    """The same greedy tokens with logprobs within `atol`, up to a step where the reference's
    top two are within `atol` of each other (a near-tie, which a rounding may flip: then the
    sequences part there and the rest is not compared)."""
    for (tokens, logprobs, _), (want_tokens, want_logprobs, margins) in zip(got, want, strict=True):
        pairs = zip(tokens, want_tokens, strict=True)
        n = next((j for j, (a, b) in enumerate(pairs) if a != b), len(want_tokens))
        if n < len(want_tokens):
            assert margins[n] < atol, (n, tokens, want_tokens, margins)
        torch.testing.assert_close(
            torch.tensor(logprobs[:n]), torch.tensor(want_logprobs[:n]), atol=atol, rtol=0
        )


def test_smollm2_kept_at_three_ranks_matches_one() -> None:
    path = str(_smollm2())
    want = anyio.run(_generate, _config(path))
    got = anyio.run(_generate, _config(path, tensor_parallel_size=3))
    # The same blocks and groups; only the all-reduce's order of sums differs (1e-5 of a layer's
    # output, above). The kernels round each call's activations to int8, so those 1e-6 changes
    # flip a few roundings, which 30 layers carry on: 0.15 at most here (the one-process
    # expansion, quantization="dequantize", is 2 away). Which roundings flip depends on the
    # CPU's kernel (AVX2 or AVX-512): on AVX2 prompt 0 parts at its 4th token, a near-tie.
    _same(got, want, atol=0.25)
    assert sum(t == w for (t, _, _), (w, _, _) in zip(got, want, strict=True)) >= 2  # the rest


def test_fp8_checkpoint_at_two_ranks(tmp_path: Path) -> None:
    folder = tmp_path / "fp8"
    folder.mkdir()
    fp8_folder(folder)
    with contextlib.ExitStack() as stack:
        reader = SafetensorsShardReader(folder, stack)
        whole = read_fp8_weights([folder / "model.safetensors"])
        block = "model.layers.0.mlp.down_proj.weight"  # 32 x 32 blocks
        kept = reader.read_kept(block, 1, 64, 128, strict=True)
        assert kept is not None and kept.scale.shape == (2, 2)  # its columns' blocks
        assert torch.equal(kept.dequantize(), whole[block].dequantize()[:, 64:128])
        channel = "model.layers.1.self_attn.q_proj.weight"  # per channel: rows cut
        kept = reader.read_kept(channel, 0, 32, 64, strict=True)
        assert kept is not None and torch.equal(kept.scale, whole[channel].scale[32:64])
        kept = reader.read_kept("model.layers.1.self_attn.o_proj.weight", 1, 32, 64, True)
        assert kept is not None and kept.scale.shape == (64, 1)  # column cut: every scale
        gate = "model.layers.0.mlp.gate_proj.weight"  # 128 rows in 4 scale blocks
        with pytest.raises(ConfigError, match=r"gate_proj.*rows \[16, 80\).*fp8 scale.*\(32 rows"):
            reader.read_kept(gate, 0, 16, 80, True)
        assert reader.read_kept(gate, 0, 16, 80, False) is None  # "auto": the dense read
        dense = reader.read(gate, 0, 16, 80)  # any cut, scale by scale
        assert torch.equal(dense, whole[gate].dequantize()[16:80])
        k = "model.layers.0.self_attn.k_proj.weight"  # 32 rows: one scale row, kept whole
        kept = reader.read_kept(k, 0, 16, 32, True)
        assert kept is not None and torch.equal(kept.dequantize(), whole[k].dequantize()[16:32])
    config = _config(str(folder), quantization="auto")
    _same(
        anyio.run(_generate, config.replace(tensor_parallel_size=2), 256),
        anyio.run(_generate, config, 256),
        1e-4,
    )


def test_a_row_cut_inside_a_block_refused_under_keep_expanded_under_auto(tmp_path: Path) -> None:
    from troupe.gpu.runner import build_runner

    # matrices all Q8_0, intermediate_size 96: at two ranks down_proj is cut at column 48,
    # inside a 32-column block
    path = str(tiny_llama_gguf(tmp_path / "tiny.gguf", "Q8_0", intermediate_size=96, scale=0.2))
    with pytest.raises(
        ConfigError,
        match=r"'model\.layers\.0\.mlp\.down_proj\.weight' is cut at columns \[(0, 48|48, 96)\)"
        r".*Q8_0 block edge \(32 columns\)",
    ):
        build_runner(_config(path, tensor_parallel_size=2))
    runner = build_runner(_config(path, tensor_parallel_size=2, quantization="auto"))
    try:
        assert runner.num_gpu_blocks == 64
    finally:
        runner.close()
    full = read_gguf_config(Path(path))  # what each rank holds: that one tensor expanded
    for rank in range(2):
        group = TPGroup(rank=rank, world_size=2, device=CPU)  # no collective is called
        model = TPDecoderModel(TPShard(rank=rank, size=2, full=full), group, torch.float32, CPU, 64)
        load_shard(model, GGUFShardReader(Path(path), full), path, KeepShards(strict=False))
        layer = model.layers[0]
        assert isinstance(layer.down_proj, torch.Tensor)
        assert all(isinstance(w, Int8Linear) for w in (layer.qkv_proj, layer.gate_up_proj))
        assert isinstance(layer.o_proj, Int8Linear)  # cut at column 32: on an edge
