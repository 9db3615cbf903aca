"""8-bit GPTQ checkpoints (gpu/gptq_int8.py): symmetric ones in group order are kept as int8
(Int8Linear, as a GGUF Q8_0 weight) whose expansion equals the reference dequantization of the
on-disk format bit for bit (tests/gptq_awq_checkpoints.py: v1 and v2 zeros, groups of 32, 128
and per channel, act-order with a plain g_idx), and greedy decoding of the kept model equals
the model loaded dense; asymmetric and real act-order ones load dense, equal to the reference,
and quantization "keep" refuses them naming the field; tensor-parallel ranks keep their int8
slices; other bit widths are refused naming `bits`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gptq_awq_checkpoints import LINEARS, write_checkpoint
from troupe.gpu.cpu_q4lib import Q4Options
from troupe.gpu.gptq_awq_format import PackedInt4Format, read_packed_int4_format
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.quant_linear import Int8Linear
from troupe.gpu.weights import load_model
from troupe.ops.quant_agreement import greedy

CPU = torch.device("cpu")
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1}
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8]
PARAMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _gptq8(group_size: int, **extra: Any) -> dict[str, Any]:
    return {"quant_method": "gptq", "bits": 8, "group_size": group_size, **extra}


def _perms(seed: int) -> dict[str, np.ndarray]:
    """Act-order input orders, shared by the parts of one fused projection."""
    rng = np.random.default_rng(seed)
    attn, mlp = rng.permutation(128), rng.permutation(128)
    return {"self_attn.q_proj": attn, "self_attn.k_proj": attn, "self_attn.v_proj": attn,
            "self_attn.o_proj": rng.permutation(128), "mlp.gate_proj": mlp,
            "mlp.up_proj": mlp, "mlp.down_proj": rng.permutation(256)}  # fmt: skip


def _fused_reference(reference: dict[str, torch.Tensor], layer: int = 0) -> dict[str, Any]:
    ref = {name: reference[f"model.layers.{layer}.{name}.weight"] for name in LINEARS}
    return {
        "qkv_proj": torch.cat([ref[f"self_attn.{x}_proj"] for x in "qkv"]),
        "o_proj": ref["self_attn.o_proj"],
        "gate_up_proj": torch.cat((ref["mlp.gate_proj"], ref["mlp.up_proj"])),
        "down_proj": ref["mlp.down_proj"],
    }


KEPT = {  # name: (family, quantization_config)
    "g32-v1": ("llama", _gptq8(32, sym=True)),
    "g128-v2": ("qwen3", _gptq8(128, sym=True, checkpoint_format="gptq_v2")),
    "per-channel-v1": ("llama", _gptq8(-1, sym=True)),
    "per-channel-v2": ("qwen3", _gptq8(-1, sym=True, checkpoint_format="gptq_v2")),
    "desc-act-plain-g_idx": ("qwen3", _gptq8(128, sym=True, desc_act=True)),  # g_idx = k // 128
}


@pytest.mark.parametrize("case", list(KEPT))
def test_symmetric_8bit_is_kept_as_int8_equal_to_the_reference(
    case: str, tmp_path: Path, mt
) -> None:
    family, qc = KEPT[case]
    reference = write_checkpoint(tmp_path, mt.make_hf_model(family, **SHAPE), qc)
    for native in (True, False):  # the native Q8 kernel's layout, then fbgemm's path
        _, model = load_model(
            tmp_path, torch.float32, CPU, 64, quantization="keep",
            cpu_kernels=Q4Options(enabled=native),
        )  # fmt: skip
        for param, want in _fused_reference(reference).items():
            weight = getattr(model.layers[0], param)
            assert isinstance(weight, Int8Linear), param
            blocks = weight.blocks
            assert blocks.group_size == 32 and blocks.codes.dtype == torch.int8, param
            assert torch.equal(blocks.dequantize(), want), (native, param)
    _, dense = load_model(tmp_path, torch.float32, CPU, 64, quantization="dequantize")
    for param, want in _fused_reference(reference).items():
        assert torch.equal(getattr(dense.layers[0], param), want), param


@pytest.mark.parametrize("case", ["g32-v1", "per-channel-v2"])
def test_kept_8bit_greedy_equals_the_dense_model(case: str, tmp_path: Path, mt) -> None:
    """The kept model (quantization "auto" on the CPU: int8) decodes the same tokens as the
    same checkpoint loaded dense (fp32), which follows transformers on the reference."""
    family, qc = KEPT[case]
    hf_model = mt.make_hf_model(family, **SHAPE)
    write_checkpoint(tmp_path, hf_model, qc)
    num_new = 8
    dense_tokens, dense_rows = greedy(_runner(tmp_path, "dequantize"), PROMPT, num_new)
    assert dense_tokens == mt.hf_greedy(hf_model, PROMPT, num_new)
    assert len(set(dense_tokens)) > 1
    kept = _runner(tmp_path, "auto")
    assert isinstance(kept.model.layers[0].gate_up_proj, Int8Linear)
    kept_tokens, kept_rows = greedy(kept, PROMPT, num_new)
    assert kept_tokens == dense_tokens
    scale = torch.stack(dense_rows).abs().max()
    delta = (torch.stack(kept_rows) - torch.stack(dense_rows)).abs().max()
    assert delta <= 0.05 * scale, (float(delta), float(scale))  # activations rounded to int8


def _runner(folder: Path, quantization: Any) -> Any:
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions

    config, model = load_model(folder, torch.float32, CPU, 256, quantization=quantization)
    options = RunnerOptions(block_size=4, num_gpu_blocks=64, num_cpu_blocks=16, max_model_len=256)
    return ModelRunner(config, model, options)


ASYM, ACT_ORDER = "sym is False", r"desc_act is True and .*g_idx"  # what "keep" names
DENSE = {  # name: (family, quantization_config, act-order, what "keep" names)
    "asym-g32-v1": ("llama", _gptq8(32, sym=False), False, ASYM),
    "asym-g128-v2": ("qwen3", _gptq8(128, sym=False, checkpoint_format="gptq_v2"), False, ASYM),
    "asym-per-channel": ("llama", _gptq8(-1, sym=False), False, ASYM),
    "act-order-g32": ("qwen3", _gptq8(32, sym=True, desc_act=True), True, ACT_ORDER),
}


@pytest.mark.parametrize("case", list(DENSE))
def test_asymmetric_and_act_order_8bit_load_dense(case: str, tmp_path: Path, mt) -> None:
    family, qc, act_order, field = DENSE[case]
    hf_model = mt.make_hf_model(family, **SHAPE)
    reference = write_checkpoint(tmp_path, hf_model, qc, _perms(0) if act_order else None)
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="auto")
    for param, want in _fused_reference(reference).items():
        weight = getattr(model.layers[0], param)
        assert isinstance(weight, torch.Tensor), param
        assert torch.equal(weight, want), param
    with pytest.raises(ModelLoadError, match=f"quantization 'keep': {field}"):
        load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")


def test_zeros_other_than_128_under_sym_true_load_dense(tmp_path: Path, mt) -> None:
    """A file whose zeros are asymmetric though its config says sym: the zeros decide."""
    hf_model = mt.make_hf_model("llama", **SHAPE)
    reference = write_checkpoint(tmp_path, hf_model, _gptq8(32, sym=False))
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["sym"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="auto")
    assert torch.equal(model.layers[0].o_proj, _fused_reference(reference)["o_proj"])
    with pytest.raises(ModelLoadError, match=r"qzeros holds 8-bit zeros other than 128"):
        load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")


def test_format_reads_bits_8_and_refuses_other_widths(tmp_path: Path, mt) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": _gptq8(128)}))
    assert read_packed_int4_format(tmp_path) == PackedInt4Format("gptq", 128, False, 1, 8, True)
    hf_model = mt.make_hf_model("llama", **SHAPE)
    write_checkpoint(tmp_path, hf_model, _gptq8(32, sym=True))
    config = json.loads((tmp_path / "config.json").read_text())
    for bits in (3, 2, 16, "8"):
        config["quantization_config"]["bits"] = bits
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(ModelLoadError, match=f"bits is {bits!r}; troupe reads 4 or 8-bit"):
            load_model(tmp_path, torch.float32, CPU, 64, quantization="auto")


@pytest.mark.parametrize("sym", [True, False])
def test_tensor_parallel_ranks_keep_their_int8_slices(sym: bool, tmp_path: Path, mt) -> None:
    """Two ranks: q/k/v and gate/up rows, o_proj and down_proj input columns (on a 32-column
    edge) of the one-process int8 weights; an asymmetric file is refused under "keep" and
    expanded under "auto", equal to the reference."""
    from troupe.config import ConfigError
    from troupe.gpu.model_config import ModelConfig
    from troupe.gpu.tp_group import TPGroup
    from troupe.gpu.tp_model import TPDecoderModel, TPShard
    from troupe.gpu.tp_quant import KeepShards
    from troupe.gpu.tp_weights import load_shard, open_shard_reader

    hf_model = mt.make_hf_model("llama", **SHAPE)
    reference = write_checkpoint(tmp_path, hf_model, _gptq8(32, sym=sym))
    w = _fused_reference(reference)
    full = ModelConfig.from_hf_folder(tmp_path)
    hd, inter = full.head_dim, full.intermediate_size // 2

    def rank_model(rank: int) -> TPDecoderModel:
        group = TPGroup(rank=rank, world_size=2, device=CPU)
        return TPDecoderModel(TPShard(rank=rank, size=2, full=full), group, torch.float32, CPU, 64)

    for rank in range(2):
        model = rank_model(rank)
        with open_shard_reader(tmp_path) as reader:
            if not sym:
                with pytest.raises(ConfigError, match=r"q_proj.*sym is False"):
                    load_shard(model, reader, "gptq", KeepShards(strict=True))
                model = rank_model(rank)
            load_shard(model, reader, "gptq", KeepShards(strict=False))
        layer = model.layers[0]
        q, i = slice(rank * 2 * hd, (rank + 1) * 2 * hd), slice(rank * inter, (rank + 1) * inter)
        nq, nk = full.num_heads * hd, full.num_kv_heads * hd
        k = slice(nq + rank * hd, nq + (rank + 1) * hd)
        v = slice(nq + nk + rank * hd, nq + nk + (rank + 1) * hd)
        want = {
            "qkv_proj": torch.cat((w["qkv_proj"][q], w["qkv_proj"][k], w["qkv_proj"][v])),
            "gate_up_proj": torch.cat((w["gate_up_proj"][i], w["gate_up_proj"][256:][i])),
            "o_proj": w["o_proj"][:, q],
            "down_proj": w["down_proj"][:, i],
        }
        for name, rows in want.items():
            weight = getattr(layer, name)
            assert isinstance(weight, Int8Linear if sym else torch.Tensor), name
            got = weight.dequantize() if isinstance(weight, Int8Linear) else weight
            assert torch.equal(got, rows), (rank, name)


@pytest.mark.gpu
def test_kept_8bit_on_cuda_is_expanded_as_q8_0_is(tmp_path: Path, mt) -> None:
    """CUDA has no int8 matmul here (gpu/quant_linear.make_quant_linear): quantization "keep"
    expands the int8 weights to the model dtype, as it does a GGUF Q8_0 weight."""
    reference = write_checkpoint(tmp_path, mt.make_hf_model("llama", **SHAPE), _gptq8(128))
    _, model = load_model(tmp_path, torch.float16, torch.device("cuda"), 64, quantization="keep")
    for param, want in _fused_reference(reference).items():
        weight = getattr(model.layers[0], param)
        assert isinstance(weight, torch.Tensor) and weight.dtype == torch.float16, param
        assert torch.equal(weight.cpu(), want.half()), param
