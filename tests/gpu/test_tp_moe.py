"""Mixture of experts under tensor parallelism (gpu/tp_moe.py), on the CPU with gloo and 2 ranks:
a tiny random Qwen3-MoE (two sparse layers around a dense one) streams the same greedy tokens
at tensor_parallel_size=2 as in one process, with each expert's rows cut and with whole experts
per rank (enable_expert_parallel), its prompt logprobs close. In process: each rank's slices,
read from a checkpoint naming experts one by one or fused as transformers 5 holds them, give
expert sums that add up to the whole layer's; what does not split is refused, naming sizes."""

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
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.moe_layer import MoeLayer
from troupe.gpu.runner import build_runner
from troupe.gpu.tp_group import TPGroup
from troupe.gpu.tp_model import TPDecoderModel, TPShard, check_tensor_parallel
from troupe.gpu.tp_moe import TPMoeLayer, local_routing
from troupe.gpu.tp_weights import SafetensorsShardReader, load_shard
from troupe.gpu.weights import load_model
from troupe.ops.cli import build_parser, config_from_args

from tests.gpu.conftest import write_random_model
from tests.gpu.test_tensor_parallel import PROMPTS, _config, _generate

TINY_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,  # the dense layer's MLP
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "mlp_only_layers": [1],  # layers 0 and 2 sparse, 1 dense
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
}


def _fuse(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The same weights with each sparse layer's experts fused (transformers 5's layout)."""
    assert config.moe is not None
    out = {k: v for k, v in weights.items() if ".mlp.experts." not in k}
    for i in range(config.num_layers):
        if not config.is_sparse(i):
            continue
        p = f"model.layers.{i}.mlp.experts."
        experts = range(config.moe.num_experts)
        out[p + "gate_up_proj"] = torch.stack(
            [
                torch.cat([weights[f"{p}{e}.gate_proj.weight"], weights[f"{p}{e}.up_proj.weight"]])
                for e in experts
            ]
        )
        out[p + "down_proj"] = torch.stack([weights[f"{p}{e}.down_proj.weight"] for e in experts])
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model's folder as checkpoints name experts ('split') and fused ('fused')."""
    root = tmp_path_factory.mktemp("tp_moe")
    return {
        "split": write_random_model(root / "split", TINY_MOE, seed=5),
        "fused": write_random_model(root / "fused", TINY_MOE, seed=5, layout=_fuse),
    }


def test_checks_name_what_does_not_split() -> None:
    config = ModelConfig.from_hf_dict(TINY_MOE)
    check_tensor_parallel(config, 2)
    check_tensor_parallel(config, 2, expert_parallel=True)
    assert config.moe is not None
    odd_experts = dataclasses.replace(config, moe=dataclasses.replace(config.moe, num_experts=7))
    check_tensor_parallel(odd_experts, 2)  # rows cut: any number of experts
    with pytest.raises(ConfigError, match=r"\(2\) must divide the model's num_experts \(7\)"):
        check_tensor_parallel(odd_experts, 2, expert_parallel=True)
    odd_rows = dataclasses.replace(
        config, moe=dataclasses.replace(config.moe, intermediate_size=33)
    )
    check_tensor_parallel(odd_rows, 2, expert_parallel=True)  # whole experts: any row count
    with pytest.raises(ConfigError, match=r"\(2\) must divide .*moe_intermediate_size \(33\)"):
        check_tensor_parallel(odd_rows, 2)
    all_sparse = dataclasses.replace(
        odd_experts,
        intermediate_size=95,  # no dense layer uses it
        moe=dataclasses.replace(config.moe, sparse_layers=(True,) * 3),
    )
    check_tensor_parallel(all_sparse, 2)
    with pytest.raises(ConfigError, match=r"intermediate_size \(95\)"):
        check_tensor_parallel(dataclasses.replace(all_sparse, moe=config.moe), 2)
    shard = TPShard(rank=1, size=2, full=config, expert_parallel=True)
    assert (shard.first_expert, shard.num_local_experts, shard.expert_intermediate_size) == (
        4,
        4,
        32,
    )
    cut = TPShard(rank=1, size=2, full=config)
    assert (cut.first_expert, cut.num_local_experts, cut.expert_intermediate_size) == (0, 8, 16)


def test_runner_refuses_before_spawning(tmp_path: Path) -> None:
    """The knob reaches the check TPRunner makes before any worker starts."""
    (tmp_path / "config.json").write_text(json.dumps({**TINY_MOE, "num_experts": 6}))
    config = _config(tmp_path, tensor_parallel_size=4, enable_expert_parallel=True)
    with pytest.raises(ConfigError, match=r"\(4\) must divide the model's num_experts \(6\)"):
        build_runner(config)


def test_cli_flag_sets_the_knob() -> None:
    parser = build_parser()
    ns = parser.parse_args(
        ["generate", "hi", "--tensor-parallel-size", "2", "--enable-expert-parallel"]
    )
    config = config_from_args(ns)
    assert config.enable_expert_parallel and config.tensor_parallel_size == 2
    assert not config_from_args(parser.parse_args(["generate", "hi"])).enable_expert_parallel


def test_local_routing_keeps_the_ranks_experts() -> None:
    weights = torch.tensor([[0.7, 0.3], [0.6, 0.4]])
    ids = torch.tensor([[5, 1], [2, 4]])
    w, i = local_routing(weights, ids, first=4, num_local=4)
    assert torch.equal(i, torch.tensor([[1, 0], [0, 0]]))
    assert torch.equal(w, torch.tensor([[0.7, 0.0], [0.0, 0.4]]))


def test_triton_kernel_sums_the_ranks_parts() -> None:
    """The fused Triton kernel (interpreter) on each rank's experts or rows, foreign slots at
    weight 0 among them: the parts add up to the reference over every expert."""
    from troupe.kernels.fused_moe import fused_moe_triton
    from troupe.kernels.moe_config import MoeKernelConfig
    from troupe.kernels.moe_reference import fused_moe, route_topk

    gen = torch.Generator().manual_seed(4)
    experts, inter, hidden = 8, 32, 64
    x = torch.randn(9, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    weights, ids = route_topk(torch.randn(9, experts, generator=gen), 2, renormalize=True)
    expected = fused_moe(x, w13, w2, weights, ids)
    for atomic in (False, True):
        config = MoeKernelConfig(block_m=16, block_n=32, block_k=32, atomic_reduce=atomic)
        by_expert = []
        for r in range(2):
            local_w13, local_w2 = w13[r * 4 : r * 4 + 4], w2[r * 4 : r * 4 + 4]
            routed = local_routing(weights, ids, r * 4, 4)
            by_expert.append(fused_moe_triton(x, local_w13, local_w2, *routed, config=config))
        by_rows, half = [], inter // 2
        for r in range(2):
            rows = slice(r * half, (r + 1) * half)
            gate_up = torch.cat([w13[:, rows], w13[:, inter:][:, rows]], dim=1)
            by_rows.append(
                fused_moe_triton(x, gate_up, w2[:, :, rows], weights, ids, config=config)
            )
        for parts in (by_expert, by_rows):
            torch.testing.assert_close(parts[0] + parts[1], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_rank_slices_sum_to_the_whole_layer(
    folders: dict[str, Path], expert_parallel: bool
) -> None:
    """Both checkpoint layouts: rank 0's expert sum + rank 1's = the whole layer's output."""
    full, whole = load_model(folders["split"], torch.float32, torch.device("cpu"), 64)
    x = torch.randn(7, full.hidden_size, generator=torch.Generator().manual_seed(0))
    for layout in ("split", "fused"):
        ranks = []
        for rank in range(2):
            shard = TPShard(rank=rank, size=2, full=full, expert_parallel=expert_parallel)
            group = TPGroup(rank=rank, world_size=2, device=torch.device("cpu"))  # no collective
            model = TPDecoderModel(shard, group, torch.float32, torch.device("cpu"), 64)
            with contextlib.ExitStack() as stack:
                load_shard(model, SafetensorsShardReader(folders[layout], stack), layout)
            ranks.append(model)
        for index in (0, 2):
            one = whole.layers[index]
            assert isinstance(one, MoeLayer)
            expected = one.mlp(x, whole.ops)
            parts = []
            for model in ranks:
                layer = model.layers[index]
                assert isinstance(layer, TPMoeLayer)
                parts.append(model.ops.fused_moe(x, layer.w13, layer.w2, *layer.route(x)))
            assert not torch.allclose(parts[0], expected, atol=1e-3)  # a part, not the whole
            torch.testing.assert_close(parts[0] + parts[1], expected, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> tuple[list[list[int]], list[float]]:
    async def run() -> tuple[list[list[int]], list[float]]:
        scores: list[list[float]] = []
        async with Engine.open(_config(folders["split"])) as engine:
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
        folders[layout], tensor_parallel_size=2, enable_expert_parallel=expert_parallel
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


@pytest.mark.gpu
def test_cuda_two_gpus_same_tokens(folders: dict[str, Path]) -> None:
    """NCCL on two GPUs, both sharding modes, eager and with CUDA graphs + overlap (the fused
    Triton experts, foreign slots at weight 0 inside the graphs), vs one GPU."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    base = _config(folders["split"]).replace(device="cuda")

    async def run(config: EngineConfig) -> list[list[int]]:
        async with Engine.open(config) as engine:
            return await _generate(engine)

    expected = anyio.run(run, base)
    for expert_parallel in (False, True):
        two = base.replace(tensor_parallel_size=2, enable_expert_parallel=expert_parallel)
        assert anyio.run(run, two.replace(enforce_eager=True)) == expected
        assert anyio.run(run, two) == expected
