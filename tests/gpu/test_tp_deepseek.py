"""DeepSeek-V3 under tensor parallelism (gpu/tp_mla.py), on the CPU with gloo and 2 ranks: a tiny
random model (q LoRA, YaRN rope, sigmoid grouped routing with correction bias, a dense first
layer, two shared experts) streams the same greedy tokens at tensor_parallel_size=2 as in one
process, with each expert's rows cut and with whole experts per rank, its prompt logprobs
close; the prefill chunks long enough take the expanded form per rank (mla_expand_min_tokens).
In process: each rank's heads give attention outputs (absorbed and expanded) and expert sums
that add up to the whole layer's, and every rank writes the same full latent cache; what does
not split is refused, naming the field."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import anyio
import pytest
import torch
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.mla_layer import MlaLayer
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.runner import build_runner
from troupe.gpu.tp_group import TPGroup
from troupe.gpu.tp_mla import TPDeepseekMoe, TPMlaLayer
from troupe.gpu.tp_model import TPDecoderModel, TPShard, check_tensor_parallel
from troupe.gpu.tp_weights import SafetensorsShardReader, load_shard
from troupe.gpu.weights import load_model, random_weights

from tests.gpu.conftest import write_random_model
from tests.gpu.test_deepseek_vs_hf import COMMON, VARIANTS, _step_meta
from tests.gpu.test_tensor_parallel import PROMPTS, _config, _generate
from tests.gpu.test_tp_moe import _fuse

TINY = {**COMMON, **VARIANTS["v3"][1], "model_type": "deepseek_v3", "n_shared_experts": 2}
CPU = torch.device("cpu")
EXPAND = 4  # prefill chunks of 4+ tokens (max_num_batched_tokens is 8) take the expanded form


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model's folder as checkpoints name experts ('split') and fused ('fused')."""
    root = tmp_path_factory.mktemp("tp_deepseek")
    return {
        "split": write_random_model(root / "split", TINY, seed=3),
        "fused": write_random_model(root / "fused", TINY, seed=3, layout=_fuse),
    }


def test_checks_name_what_does_not_split() -> None:
    config = ModelConfig.from_hf_dict(TINY)
    assert config.moe is not None
    check_tensor_parallel(config, 2)
    check_tensor_parallel(config, 2, expert_parallel=True)
    with pytest.raises(ConfigError, match=r"\(3\) must divide .*num_attention_heads \(4\)"):
        check_tensor_parallel(config, 3)
    six = dataclasses.replace(config, moe=dataclasses.replace(config.moe, num_experts=6))
    check_tensor_parallel(six, 4)  # rows cut: any number of experts
    with pytest.raises(ConfigError, match=r"\(4\) must divide the model's n_routed_experts \(6\)"):
        check_tensor_parallel(six, 4, expert_parallel=True)
    odd = dataclasses.replace(
        config, moe=dataclasses.replace(config.moe, intermediate_size=33, num_shared_experts=1)
    )
    with pytest.raises(ConfigError, match=r"\(2\) must divide .*moe_intermediate_size \(33\)"):
        check_tensor_parallel(odd, 2)
    # whole experts per rank, but the shared experts are still cut like a dense MLP
    with pytest.raises(
        ConfigError, match=r"\(2\) must divide the shared experts' .*moe_intermediate_size = 33\)"
    ):
        check_tensor_parallel(odd, 2, expert_parallel=True)
    two_shared = dataclasses.replace(odd, moe=dataclasses.replace(odd.moe, num_shared_experts=2))
    check_tensor_parallel(two_shared, 2, expert_parallel=True)  # 66 shared rows split
    with pytest.raises(ConfigError, match=r"intermediate_size \(95\)"):
        check_tensor_parallel(dataclasses.replace(config, intermediate_size=95), 2)
    shard = TPShard(rank=1, size=2, full=config, expert_parallel=True)
    layers = shard.layer_config()
    assert layers.mla is not None and layers.moe is not None
    assert (layers.mla.num_heads, layers.mla.latent_size) == (2, 40)  # all the latent
    assert (shard.first_expert, shard.num_local_experts, shard.shared_intermediate_size) == (
        4,
        4,
        32,
    )
    assert layers.moe.intermediate_size == 32 and layers.kv_cache_planes == 1


def test_runner_refuses_before_spawning(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "n_routed_experts": 6, "n_group": 2}))
    config = _config(tmp_path, tensor_parallel_size=4, enable_expert_parallel=True)
    with pytest.raises(ConfigError, match=r"\(4\) must divide the model's n_routed_experts \(6\)"):
        build_runner(config)


def _shard_models(folder: Path, expert_parallel: bool) -> list[TPDecoderModel]:
    full = ModelConfig.from_hf_dict(TINY)
    models = []
    for rank in range(2):
        shard = TPShard(rank=rank, size=2, full=full, expert_parallel=expert_parallel)
        group = TPGroup(rank=rank, world_size=2, device=CPU)  # no collective is called
        model = TPDecoderModel(shard, group, torch.float32, CPU, 64)
        with contextlib.ExitStack() as stack:
            load_shard(model, SafetensorsShardReader(folder, stack), str(folder))
        models.append(model)
    return models


def _cache(config: ModelConfig) -> KVCache:
    return KVCache(config, num_gpu_blocks=32, num_cpu_blocks=0, block_size=4,
                   dtype=torch.float32, device=CPU)  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "expert_parallel"), [("split", False), ("fused", True)], ids=["rows", "experts"]
)
def test_rank_slices_sum_to_the_whole_layer(
    folders: dict[str, Path], layout: str, expert_parallel: bool
) -> None:
    """Attention (a prefill step absorbed, then a decode beside a chunk expanded) and the MLP
    (dense layer 0, experts + shared experts on layer 1): rank 0's part + rank 1's = the whole
    layer's output; both ranks' latent caches hold the whole model's rows."""
    full, whole = load_model(folders["split"], torch.float32, CPU, 64)
    ranks = _shard_models(folders[layout], expert_parallel)
    caches = [_cache(model.shard.layer_config()) for model in ranks]
    whole_cache = _cache(full)
    gen = torch.Generator().manual_seed(0)
    steps = [
        _step_meta([9, 6], [9, 6], split=False, device=CPU),
        _step_meta([10, 9], [1, 3], split=True, device=CPU),  # a decode, then a chunk
    ]
    for (meta, positions), expanded in zip(steps, (False, True), strict=True):
        assert (meta.expanded_prefill is not None) == expanded
        x = torch.randn(positions.numel(), full.hidden_size, generator=gen)
        for index in range(full.num_layers):
            one = whole.layers[index]
            assert isinstance(one, MlaLayer)
            cos_sin = whole.get_buffer("cos_sin_cache")
            kv = whole_cache.layers[index]
            expected = one.attention(x, positions, meta, kv, cos_sin, whole.ops)
            expected_mlp = one.mlp(x, whole.ops)
            parts, mlp_parts = [], []
            for model, cache in zip(ranks, caches, strict=True):
                layer = model.layers[index]
                assert isinstance(layer, TPMlaLayer)
                assert layer.kv_b_proj.shape[0] == 2 * (16 + 16)  # two heads of four
                # MlaLayer's own attention/mlp: TPDecoderLayer's all-reduce is the sum below
                parts.append(
                    MlaLayer.attention(layer, x, positions, meta, cache.layers[index],
                                       model.get_buffer("cos_sin_cache"), model.ops)
                )  # fmt: skip
                mlp_parts.append(MlaLayer.mlp(layer, x, model.ops))
                assert isinstance(layer.experts, TPDeepseekMoe) == (index == 1)
                slots = meta.slot_mapping.long()
                rows = cache.layers[index][0].reshape(-1, 40)[slots]
                torch.testing.assert_close(rows, kv[0].reshape(-1, 40)[slots], atol=0, rtol=0)
            for got, want in ((parts, expected), (mlp_parts, expected_mlp)):
                assert not torch.allclose(got[0], want, atol=1e-3)  # a part, not the whole
                torch.testing.assert_close(got[0] + got[1], want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> tuple[list[list[int]], list[float]]:
    async def run() -> tuple[list[list[int]], list[float]]:
        scores: list[list[float]] = []
        async with Engine.open(_config(folders["split"], mla_expand_min_tokens=EXPAND)) as engine:
            tokens = await _generate(engine, scores)
        return tokens, scores[0]

    return anyio.run(run)


@pytest.mark.parametrize(
    ("layout", "expert_parallel"), [("split", False), ("fused", True)], ids=["rows", "experts"]
)
def test_same_tokens_at_two_ranks(
    folders: dict[str, Path],
    reference: tuple[list[list[int]], list[float]],
    layout: str,
    expert_parallel: bool,
) -> None:
    expected, expected_scores = reference
    assert len({tuple(t) for t in expected}) == len(expected)  # distinct: not degenerate
    config = _config(
        folders[layout],
        tensor_parallel_size=2,
        enable_expert_parallel=expert_parallel,
        mla_expand_min_tokens=EXPAND,
    )

    async def run() -> tuple[list[list[int]], list[float]]:
        scores: list[list[float]] = []
        async with Engine.open(config) as engine:
            tokens = await _generate(engine, scores)
        return tokens, scores[0]

    tokens, scores = anyio.run(run)
    assert tokens == expected
    assert len(scores) == len(PROMPTS[0]) - 1
    assert scores == pytest.approx(expected_scores, abs=1e-4)


def test_deepseek_gguf_is_refused_by_name(tmp_path: Path) -> None:
    """llama.cpp's deepseek2 layout (merged experts, kv_b split per head) is not sliced."""
    pytest.importorskip("gguf")
    from troupe.gpu.gguf_weights import read_gguf_config
    from troupe.gpu.model_config import ModelLoadError
    from troupe.gpu.tp_weights import GGUFShardReader

    from tests.gpu.test_deepseek_gguf import HF, _write_gguf

    cfg = {**HF, "model_type": "deepseek_v2"}
    weights = random_weights(ModelConfig.from_hf_dict(cfg), torch.float32, seed=5, std=0.2)
    path = tmp_path / "tiny-deepseek2.gguf"
    _write_gguf(path, {k: t.numpy() for k, t in weights.items()}, cfg, True)
    with pytest.raises(ModelLoadError, match=r"arch 'deepseek2'.*tensor_parallel_size > 1"):
        GGUFShardReader(path, read_gguf_config(path))


@pytest.mark.gpu
def test_cuda_two_gpus_same_tokens(folders: dict[str, Path]) -> None:
    """NCCL on two GPUs, both expert modes, eager and with CUDA graphs + overlap (the Triton
    MLA kernels over each rank's heads, the all-reduces inside the graphs), vs one GPU."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    base = _config(folders["split"], mla_expand_min_tokens=EXPAND).replace(device="cuda")

    async def run(config: EngineConfig) -> list[list[int]]:
        async with Engine.open(config) as engine:
            return await _generate(engine)

    expected = anyio.run(run, base)
    for expert_parallel in (False, True):
        two = base.replace(tensor_parallel_size=2, enable_expert_parallel=expert_parallel)
        assert anyio.run(run, two.replace(enforce_eager=True)) == expected
        assert anyio.run(run, two) == expected
