"""GPTQ and AWQ checkpoints (gpu/gptq_awq_*.py) kept 4-bit: the loaded weights expand to the
reference dequantization of the on-disk format bit for bit (tests/gptq_awq_checkpoints.py, v1
and v2 zeros, sym and asym, groups of 32, 128 and per channel, act-order), greedy tokens and
logits follow HF transformers running that reference in fp32, fp16 factors round only the
bias, fused parts with different act-orders and variants troupe cannot read are refused, and
tensor-parallel ranks and pipeline stages take their slices (gpu/tp_packed_int4.py,
gpu/pp_weights.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gptq_awq_checkpoints import LINEARS, write_checkpoint
from troupe.gpu.gptq_awq_format import PackedInt4Format, read_packed_int4_format
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.quant_linear import Int4Linear
from troupe.gpu.weights import load_model
from troupe.ops.quant_agreement import Stream, greedy

CPU = torch.device("cpu")
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1}
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8]


def _gptq(group_size: int, **extra: Any) -> dict[str, Any]:
    return {"quant_method": "gptq", "bits": 4, "group_size": group_size, **extra}


def _awq(group_size: int) -> dict[str, Any]:
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
            "version": "gemm"}  # fmt: skip


def _perms(seed: int, hidden: int, inter: int, split: bool = False) -> dict[str, np.ndarray]:
    """Act-order input orders: one per input (q/k/v share one, gate/up one); `split` gives k
    an order of its own (a checkpoint troupe must refuse)."""
    rng = np.random.default_rng(seed)
    attn, mlp = rng.permutation(hidden), rng.permutation(hidden)
    perms = {"self_attn.q_proj": attn, "self_attn.k_proj": attn, "self_attn.v_proj": attn,
             "self_attn.o_proj": rng.permutation(hidden), "mlp.gate_proj": mlp,
             "mlp.up_proj": mlp, "mlp.down_proj": rng.permutation(inter)}  # fmt: skip
    if split:
        perms["self_attn.k_proj"] = rng.permutation(hidden)
    return perms


def _fused_reference(reference: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    p = f"model.layers.{layer}."
    ref = {name: reference[p + name + ".weight"] for name in LINEARS}
    return {
        "qkv_proj": torch.cat([ref[f"self_attn.{x}_proj"] for x in "qkv"]),
        "o_proj": ref["self_attn.o_proj"],
        "gate_up_proj": torch.cat((ref["mlp.gate_proj"], ref["mlp.up_proj"])),
        "down_proj": ref["mlp.down_proj"],
    }


CASES = {  # name: (family, quantization_config, act-order)
    "gptq-g32-asym-v1": ("llama", _gptq(32, sym=False), False),
    "gptq-g128-sym-v2": ("qwen3", _gptq(128, sym=True, checkpoint_format="gptq_v2"), False),
    "gptq-per-channel": ("llama", _gptq(-1, sym=False), False),
    "gptq-desc-act-g32": ("qwen3", _gptq(32, sym=False, desc_act=True), True),
    "awq-g32": ("llama", _awq(32), False),
    "awq-g128": ("qwen3", _awq(128), False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kept_weights_expand_to_the_reference(case: str, tmp_path: Path, mt) -> None:
    family, qc, act_order = CASES[case]
    hf_model = mt.make_hf_model(family, **SHAPE)
    perms = _perms(0, 128, 256) if act_order else None
    reference = write_checkpoint(tmp_path, hf_model, qc, perms)
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")
    for param, want in _fused_reference(reference, 0).items():
        weight = getattr(model.layers[0], param)
        assert isinstance(weight, Int4Linear), param
        assert (weight.in_perm is not None) == act_order, param
        assert torch.equal(weight.dequantize(), want), param
    _, dense = load_model(tmp_path, torch.float32, CPU, 64, quantization="dequantize")
    assert torch.equal(dense.layers[0].qkv_proj, _fused_reference(reference, 0)["qkv_proj"])


@pytest.mark.parametrize("case", ["gptq-desc-act-g32", "awq-g128"])
def test_greedy_and_logits_follow_hf_on_the_reference(case: str, tmp_path: Path, mt) -> None:
    """transformers' fp32 run of the reference weights against troupe: "dequantize" greedy is
    token-identical; kept 4-bit on the CPU (activations rounded to int8 per group), fed the
    same tokens, gives logits within a few percent and the same argmax wherever transformers'
    top two are not a near-tie (as tests/gpu/test_quant_smollm.py)."""
    family, qc, act_order = CASES[case]
    hf_model = mt.make_hf_model(family, **SHAPE)
    write_checkpoint(tmp_path, hf_model, qc, _perms(1, 128, 256) if act_order else None)
    num_new = 6
    want = mt.hf_greedy(hf_model, PROMPT, num_new)
    assert len(set(want)) > 1
    with torch.no_grad():
        hf_logits = hf_model(torch.tensor([PROMPT + want[:-1]])).logits[0, len(PROMPT) - 1 :]
    scale = hf_logits.abs().max()
    tokens, rows = greedy(_dense_runner(tmp_path), PROMPT, num_new)
    assert tokens == want
    assert (torch.stack(rows) - hf_logits).abs().max() <= 1e-4 * scale
    runner = mt.runner_for(tmp_path)  # "auto" on the CPU: kept
    weight = runner.model.layers[0].qkv_proj
    assert isinstance(weight, Int4Linear) and (weight.in_perm is not None) == act_order
    stream = Stream(runner, "kept")
    kept = torch.stack([stream.feed(PROMPT)] + [stream.feed([t]) for t in want[:-1]])
    delta = (kept - hf_logits).abs().max()
    assert 0 < delta <= 0.05 * scale, (float(delta), float(scale))
    top2 = hf_logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.25
    assert int(clear.sum()) >= 3
    assert torch.equal(kept.argmax(-1)[clear], hf_logits.argmax(-1)[clear])


def _dense_runner(folder: Path) -> Any:
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions

    config, model = load_model(folder, torch.float32, CPU, 256, quantization="dequantize")
    assert isinstance(model.layers[0].qkv_proj, torch.Tensor)
    options = RunnerOptions(block_size=4, num_gpu_blocks=64, num_cpu_blocks=16, max_model_len=256)
    return ModelRunner(config, model, options)


def test_fused_parts_with_different_act_orders_are_refused(tmp_path: Path, mt) -> None:
    hf_model = mt.make_hf_model("llama", **SHAPE)
    write_checkpoint(tmp_path, hf_model, _gptq(32, desc_act=True), _perms(2, 128, 256, True))
    with pytest.raises(ModelLoadError, match=r"q_proj.*k_proj.*g_idx"):
        load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")
    # expanded, each part keeps its own order: nothing to share
    _, dense = load_model(tmp_path, torch.float32, CPU, 64, quantization="dequantize")
    assert isinstance(dense.layers[0].qkv_proj, torch.Tensor)


def test_fp16_factors_round_only_the_bias(tmp_path: Path, mt) -> None:
    """The CUDA column layout keeps scale and bias in fp16 (kernels/quant_int4.Int4Cols): the
    scale is the shipped fp16, and each weight is off by at most the rounding of -z * s."""
    from troupe.kernels.quant_int4 import Int4Cols

    hf_model = mt.make_hf_model("qwen3", **SHAPE)
    reference = write_checkpoint(tmp_path, hf_model, _gptq(128, sym=False), None)
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")
    blocks = model.layers[0].down_proj.blocks()
    cols = Int4Cols.from_rows(blocks.packed, blocks.scale, blocks.bias)
    assert torch.equal(cols.scale.t().float(), blocks.scale)
    got = type(blocks)(*cols.rows(), 32).dequantize()  # fp16 factors, expanded in fp32
    want = reference["model.layers.0.mlp.down_proj.weight"]
    bound = (blocks.bias.abs() * 2.0**-11).repeat_interleave(32, dim=1)  # half an fp16 ulp
    assert ((got - want).abs() <= bound).all()
    assert (got != want).any()  # some biases did round


@pytest.mark.parametrize(
    ("qc", "field"),
    [
        (_gptq(128, bits=3), "bits is 3"),
        ({**_awq(128), "bits": 8}, "bits is 8"),
        (_gptq(128, bits=True), "bits is True"),
        (_gptq(16), "group_size is 16"),
        (_gptq(128, checkpoint_format="marlin"), "checkpoint_format is 'marlin'"),
        (_gptq(128, is_marlin_format=True), "is_marlin_format"),
        (_gptq(128, desc_act="yes"), "desc_act is 'yes'"),
        ({**_awq(128), "version": "gemv_fast"}, "version is 'gemv_fast'"),
        ({**_awq(128), "version": "exllama"}, "version is 'exllama'"),
        ({**_awq(128), "zero_point": False}, "zero_point is False"),
        ({**_awq(128), "group_size": -1}, "group_size is -1"),
        ({"quant_method": "marlin", "bits": 4}, "quant_method 'marlin'"),
    ],
)
def test_unsupported_variants_are_refused_naming_the_field(
    qc: dict[str, Any], field: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    with pytest.raises(ModelLoadError, match=field):
        read_packed_int4_format(tmp_path)


def test_format_read_from_config_or_legacy_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": _gptq(64)}))
    assert read_packed_int4_format(tmp_path) == PackedInt4Format("gptq", 64, False, 1)
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": _awq(128)}))
    assert read_packed_int4_format(tmp_path) == PackedInt4Format("awq", 128)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert read_packed_int4_format(tmp_path) is None
    legacy = {"bits": 4, "group_size": 128, "desc_act": True, "sym": True}  # AutoGPTQ's file
    (tmp_path / "quantize_config.json").write_text(json.dumps(legacy))
    assert read_packed_int4_format(tmp_path) == PackedInt4Format("gptq", 128, True, 1)
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": fp8}))
    assert read_packed_int4_format(tmp_path) is None


def test_a_pipeline_stage_expands_its_own_layers(tmp_path: Path, mt) -> None:
    """Stage 1 of 2 reads only layer 1 (renumbered 0) and the head, expanded to fp32."""
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.pp_model import PPStageModel
    from troupe.gpu.pp_stage import PPStage
    from troupe.gpu.pp_weights import load_stage
    from troupe.gpu.tp_group import TPGroup

    hf_model = mt.make_hf_model("llama", **{**SHAPE, "num_hidden_layers": 2})
    reference = write_checkpoint(tmp_path, hf_model, _gptq(64, desc_act=True), _perms(5, 128, 256))
    full = ModelConfig.from_hf_folder(tmp_path)
    group = TPGroup(rank=1, world_size=2, device=CPU)
    stage = PPStageModel(PPStage.of(full, 1, 2, None), full, group, torch.float32, CPU, 64)
    load_stage(stage, tmp_path, full)
    for param, want in _fused_reference(reference, 1).items():
        assert torch.equal(getattr(stage.layers[0], param), want), param


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gptq-desc-act-g32", "awq-g128"])
def test_kept_4bit_on_cuda_matches_the_reference(case: str, tmp_path: Path, mt) -> None:
    family, qc, act_order = CASES[case]
    hf_model = mt.make_hf_model(family, **SHAPE)
    reference = write_checkpoint(tmp_path, hf_model, qc, _perms(3, 128, 256) if act_order else None)
    cuda = torch.device("cuda")
    _, model = load_model(tmp_path, torch.float16, cuda, 64, quantization="keep")
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0)) * 0.5
    for param, want in _fused_reference(reference, 0).items():
        weight = getattr(model.layers[0], param)
        assert isinstance(weight, Int4Linear) and (weight.in_perm is not None) == act_order
        xs = x if want.shape[1] == 128 else torch.randn(5, want.shape[1]) * 0.5
        ref = xs @ want.T
        for rows in (xs, xs[:1]):  # the tile kernel, then the decode GEMV
            got = weight(rows.to(cuda, torch.float16)).float().cpu()
            r = ref[: rows.shape[0]]
            assert (got - r).abs().max() <= 2e-2 * r.abs().max(), param


@pytest.mark.parametrize("act_order", [False, True])
def test_tensor_parallel_ranks_keep_their_slices(act_order: bool, tmp_path: Path, mt) -> None:
    """Two ranks read a GPTQ folder: each keeps its rows (q/k/v, gate/up, with the whole
    input order under act-order) and its input columns (o_proj, down_proj) of the one-process
    weights; an act-order weight is not cut by inputs: refused under "keep", expanded under
    "auto"."""
    from troupe.config import ConfigError
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.tp_group import TPGroup
    from troupe.gpu.tp_model import TPDecoderModel, TPShard
    from troupe.gpu.tp_quant import KeepShards
    from troupe.gpu.tp_weights import load_shard, open_shard_reader

    hf_model = mt.make_hf_model("llama", **SHAPE)
    qc = _gptq(32, sym=False, desc_act=act_order)
    write_checkpoint(tmp_path, hf_model, qc, _perms(4, 128, 256) if act_order else None)
    _, whole = load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")
    full = ModelConfig.from_hf_folder(tmp_path)
    hd, inter = full.head_dim, full.intermediate_size // 2
    w = {
        name: getattr(whole.layers[0], name).dequantize()
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    }

    def rank_model(rank: int) -> TPDecoderModel:
        group = TPGroup(rank=rank, world_size=2, device=CPU)
        return TPDecoderModel(TPShard(rank=rank, size=2, full=full), group, torch.float32, CPU, 64)

    for rank in range(2):
        model = rank_model(rank)
        with open_shard_reader(tmp_path) as reader:
            if act_order:
                with pytest.raises(ConfigError, match=r"o_proj.*columns.*act-order"):
                    load_shard(model, reader, "gptq", KeepShards(strict=True))
                model = rank_model(rank)  # a fresh one for the load that passes
            load_shard(model, reader, "gptq", KeepShards(strict=False))
        layer = model.layers[0]
        q, i = slice(rank * 2 * hd, (rank + 1) * 2 * hd), slice(rank * inter, (rank + 1) * inter)
        nq, nk = full.num_heads * hd, full.num_kv_heads * hd
        k, v = (
            slice(nq + rank * hd, nq + (rank + 1) * hd),
            slice(nq + nk + rank * hd, nq + nk + (rank + 1) * hd),
        )
        want = {
            "qkv_proj": torch.cat((w["qkv_proj"][q], w["qkv_proj"][k], w["qkv_proj"][v])),
            "gate_up_proj": torch.cat((w["gate_up_proj"][i], w["gate_up_proj"][256:][i])),
            "o_proj": w["o_proj"][:, q],
            "down_proj": w["down_proj"][:, i],
        }
        for name, rows in want.items():
            weight = getattr(layer, name)
            row_cut = name in ("o_proj", "down_proj")
            assert isinstance(weight, torch.Tensor if act_order and row_cut else Int4Linear), name
            got = weight if isinstance(weight, torch.Tensor) else weight.dequantize()
            assert torch.equal(got, rows), (rank, name)
        assert (layer.qkv_proj.in_perm is not None) == act_order
