"""Integer compressed-tensors checkpoints (gpu/ct_format.py, gpu/ct_unpack.py, gpu/ct_reader.py):
pack-quantized 4-bit (symmetric and asymmetric) and 8-bit (symmetric) in groups or per channel
are kept as int4 / int8 whose expansion equals the reference dequantization of the on-disk
format (tests/ct_checkpoints.py) bit for bit; int-quantized W8A8 weights load weight-only as
int8; greedy decoding of the kept model equals the dense load; an ignored lm_head (or a module
ignored by pattern) stays dense; forms the kept layouts cannot hold load dense and "keep"
refuses them naming the field; unread formats are refused naming the field; compressed-tensors
fp8 folders still go through gpu/fp8_weights.py. Tensor-parallel ranks and pipeline stages:
tests/gpu/test_compressed_tensors_parallel.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ct_checkpoints import scheme, write_ct_checkpoint
from safetensors.torch import load_file, save_file
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.quant_linear import Int4Linear, Int8Linear
from troupe.gpu.weights import load_model
from troupe.ops.quant_agreement import Stream, greedy

CPU = torch.device("cpu")
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1}
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8]


def _fused(refs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    r = {name.split(".", 3)[-1].removesuffix(".weight"): t for name, t in refs.items()}
    return {
        "qkv_proj": torch.cat([r[f"self_attn.{x}_proj"] for x in "qkv"]),
        "o_proj": r["self_attn.o_proj"],
        "gate_up_proj": torch.cat((r["mlp.gate_proj"], r["mlp.up_proj"])),
        "down_proj": r["mlp.down_proj"],
    }


KEPT = {  # name: (family, quantization_config, kept layer class)
    "w4a16-g128-sym": ("llama", scheme("pack-quantized", 4), Int4Linear),
    "w4a16-g32-asym": ("qwen3", scheme("pack-quantized", 4, group_size=32, symmetric=False),
                       Int4Linear),
    "w4a16-channel-sym": ("llama", scheme("pack-quantized", 4, "channel"), Int4Linear),
    "w4a16-channel-asym": ("llama", scheme("pack-quantized", 4, "channel", symmetric=False),
                           Int4Linear),
    "w8a16-g64-sym": ("qwen3", scheme("pack-quantized", 8, group_size=64), Int8Linear),
    "w8a16-channel-sym": ("llama", scheme("pack-quantized", 8, "channel"), Int8Linear),
    "w8a8-int-quantized": ("llama", scheme("int-quantized", 8, "channel", w8a8=True), Int8Linear),
    "actorder-weight": ("qwen3", scheme("pack-quantized", 4, actorder="weight"), Int4Linear),
}  # fmt: skip


@pytest.mark.parametrize("case", list(KEPT))
def test_kept_weights_equal_the_reference(case: str, tmp_path: Path, mt) -> None:
    family, qc, kind = KEPT[case]
    hf_model = mt.make_hf_model(family, tie_word_embeddings=False, **SHAPE)
    lm_head = hf_model.lm_head.weight.detach().clone()
    refs = write_ct_checkpoint(tmp_path, hf_model, qc)
    assert "lm_head.weight" not in refs  # ignored: written dense
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")
    for param, want in _fused(refs).items():
        weight = getattr(model.layers[0], param)
        assert isinstance(weight, kind), param
        assert torch.equal(weight.dequantize(), want), param
    assert isinstance(model.lm_head, torch.Tensor) and torch.equal(model.lm_head, lm_head)
    _, dense = load_model(tmp_path, torch.float32, CPU, 64, quantization="dequantize")
    for param, want in _fused(refs).items():
        assert torch.equal(getattr(dense.layers[0], param), want), param


@pytest.mark.parametrize("case", ["w4a16-g32-asym", "w8a8-int-quantized"])
def test_kept_model_follows_the_dense_model(case: str, tmp_path: Path, mt) -> None:
    """The kept model ("auto" on the CPU), fed the dense model's greedy tokens, gives logits
    within the rounding of its int8 activations of the same folder loaded dense (fp32, which
    follows transformers on the reference weights) and the same argmax wherever the top two
    are clearly apart (as tests/gpu/test_gptq_awq.py allows int4); int8 decodes the same
    tokens outright (as tests/gpu/test_gptq_int8.py)."""
    family, qc, kind = KEPT[case]
    hf_model = mt.make_hf_model(family, **SHAPE)
    write_ct_checkpoint(tmp_path, hf_model, qc)
    num_new = 8
    want, dense_rows = greedy(_runner(tmp_path, "dequantize"), PROMPT, num_new)
    assert want == mt.hf_greedy(hf_model, PROMPT, num_new)
    assert len(set(want)) > 1
    kept = _runner(tmp_path, "auto")
    assert isinstance(kept.model.layers[0].gate_up_proj, kind)
    stream = Stream(kept, "kept")
    rows = torch.stack([stream.feed(PROMPT)] + [stream.feed([t]) for t in want[:-1]])
    dense = torch.stack(dense_rows)
    scale = dense.abs().max()
    delta = (rows - dense).abs().max()
    assert 0 < delta <= 0.05 * scale, (float(delta), float(scale))
    top2 = dense.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.25
    assert int(clear.sum()) >= 3
    assert torch.equal(rows.argmax(-1)[clear], dense.argmax(-1)[clear])
    if kind is Int8Linear:
        assert greedy(_runner(tmp_path, "auto"), PROMPT, num_new)[0] == want


def _runner(folder: Path, quantization: Any) -> Any:
    from troupe.gpu.model_runner import ModelRunner, RunnerOptions

    config, model = load_model(folder, torch.float32, CPU, 256, quantization=quantization)
    options = RunnerOptions(block_size=4, num_gpu_blocks=64, num_cpu_blocks=16, max_model_len=256)
    return ModelRunner(config, model, options)


DENSE = {  # name: (quantization_config, actorder "group" g_idx, what "keep" names)
    "w8-asym": (scheme("pack-quantized", 8, symmetric=False), False, "weights.symmetric is False"),
    "actorder-group": (scheme("pack-quantized", 4, group_size=32, actorder="group"), True,
                       "weights.actorder is 'group'"),
    "tensor": (scheme("pack-quantized", 8, "tensor"), False, "weights.strategy is 'tensor'"),
    "group-16": (scheme("pack-quantized", 4, group_size=16), False, "weights.group_size is 16"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(DENSE))
def test_unkept_forms_load_dense_and_keep_refuses_them(case: str, tmp_path: Path, mt) -> None:
    qc, act_order, field = DENSE[case]
    hf_model = mt.make_hf_model("qwen3", **SHAPE)
    refs = write_ct_checkpoint(tmp_path, hf_model, qc, perm_seed=0 if act_order else None)
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="auto")
    for param, want in _fused(refs).items():
        weight = getattr(model.layers[0], param)
        assert isinstance(weight, torch.Tensor) and torch.equal(weight, want), param
    with pytest.raises(ModelLoadError, match=f"quantization 'keep': .*{field}"):
        load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")


def test_modules_ignored_by_pattern_stay_dense(tmp_path: Path, mt) -> None:
    """`ignore` entries by "re:" pattern: those modules are written and loaded dense; a quantized
    lm_head (not ignored) is kept too."""
    qc = scheme("pack-quantized", 4, ignore=("re:.*down_proj$",))
    hf_model = mt.make_hf_model("llama", tie_word_embeddings=False, **SHAPE)
    down = hf_model.model.layers[0].mlp.down_proj.weight.detach().clone()
    refs = write_ct_checkpoint(tmp_path, hf_model, qc)
    assert "lm_head.weight" in refs
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="keep")
    layer = model.layers[0]
    assert isinstance(layer.down_proj, torch.Tensor) and torch.equal(layer.down_proj, down)
    assert isinstance(layer.o_proj, Int4Linear)
    assert isinstance(model.lm_head, Int4Linear)
    assert torch.equal(model.lm_head.dequantize(), refs["lm_head.weight"])


REFUSED = [  # (edit to the group or top level, field named)
    ({"format": "marlin-24"}, "format is 'marlin-24'"),
    ({"format": "nvfp4-pack-quantized"}, "format is 'nvfp4-pack-quantized'"),
    ({"weights.type": "float"}, "weights.type is 'float'"),
    ({"weights.num_bits": 2}, "weights.num_bits is 2"),
    ({"weights.strategy": "block"}, "weights.strategy is 'block'"),
    ({"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme is"),
]


@pytest.mark.parametrize(("edit", "field"), REFUSED)
def test_unread_formats_are_refused_naming_the_field(
    edit: dict[str, Any], field: str, tmp_path: Path, mt
) -> None:
    write_ct_checkpoint(tmp_path, mt.make_hf_model("llama", **SHAPE), scheme("pack-quantized", 4))
    config = json.loads((tmp_path / "config.json").read_text())
    qc = config["quantization_config"]
    for key, value in edit.items():
        if key.startswith("weights."):
            qc["config_groups"]["group_0"]["weights"][key[len("weights.") :]] = value
        else:
            qc[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=field):
        load_model(tmp_path, torch.float32, CPU, 64, quantization="auto")


def test_fp8_float_quantized_folders_still_load_as_fp8(tmp_path: Path, mt) -> None:
    """A compressed-tensors "float-quantized" folder is not read here: its fp8 weights go
    through gpu/fp8_weights.py (expanded on the CPU), `input_scale` dropped."""
    hf_model = mt.make_hf_model("llama", **SHAPE)
    hf_model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    scale = tensors[name].abs().amax(dim=1, keepdim=True) / 448
    q = (tensors[name] / scale).to(torch.float8_e4m3fn)
    tensors[name] = q
    tensors[name.replace("weight", "weight_scale")] = scale
    tensors[name.replace("weight", "input_scale")] = torch.tensor([0.1])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    qc = scheme("float-quantized", 8, "channel", w8a8=True)
    qc["config_groups"]["group_0"]["weights"]["type"] = "float"
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, model = load_model(tmp_path, torch.float32, CPU, 64, quantization="auto")
    assert torch.equal(model.layers[0].down_proj, q.float() * scale)
