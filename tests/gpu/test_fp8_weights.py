"""HF checkpoints shipping fp8 weights (gpu/fp8_weights.py): block-wise `weight_scale_inv` and
per-channel `weight_scale`; expanded exactly on the CPU, kept as fp8 (Fp8Linear) on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from troupe.gpu.fp8_weights import Fp8Weight, concat_fp8, read_fp8_weights
from troupe.gpu.quant_linear import Fp8Linear
from troupe.gpu.weights import load_model, qwen3_tiny_config
from troupe.ops.bench_offline import write_model_folder

CONFIG = qwen3_tiny_config(vocab_size=256)


def fp8_folder(folder: Path) -> dict[str, torch.Tensor]:
    """A tiny Qwen3 folder whose projections are fp8: layer 0 in 32 x 32 blocks, layer 1 per
    channel. Returns the expanded fp32 weights by name."""
    write_model_folder(folder, CONFIG)
    tensors = load_file(str(folder / "model.safetensors"))
    expanded = {}
    for name in list(tensors):
        if "proj.weight" not in name:
            continue
        w = tensors[name].float() * 40
        if ".layers.0." in name:
            blocks = w.reshape(w.shape[0] // 32, 32, w.shape[1] // 32, 32)
            scale = blocks.abs().amax(dim=(1, 3)) / 448
            full = scale.repeat_interleave(32, 0).repeat_interleave(32, 1)
            tensors[name[: -len("weight")] + "weight_scale_inv"] = scale
        else:
            scale = w.abs().amax(dim=1, keepdim=True) / 448
            full = scale
            tensors[name[: -len("weight")] + "weight_scale"] = scale
        q = (w / full).to(torch.float8_e4m3fn)
        tensors[name] = q
        expanded[name] = q.float() * full
    save_file(tensors, str(folder / "model.safetensors"))
    return expanded


def test_fp8_folder_expands_exactly_on_the_cpu(tmp_path: Path) -> None:
    expanded = fp8_folder(tmp_path)
    fp8 = read_fp8_weights([tmp_path / "model.safetensors"])
    assert set(fp8) == set(expanded)
    for name, weight in fp8.items():
        assert torch.equal(weight.dequantize(), expanded[name])
    _, model = load_model(tmp_path, torch.float32, torch.device("cpu"), 64, quantization="auto")
    layer = model.layers[0]
    assert isinstance(layer.qkv_proj, torch.Tensor)  # no fp8 kernel on the CPU: expanded
    prefix = "model.layers.0.self_attn."
    want = torch.cat([expanded[prefix + p + "_proj.weight"] for p in "qkv"])
    assert torch.equal(layer.qkv_proj, want)
    assert torch.equal(model.layers[1].down_proj, expanded["model.layers.1.mlp.down_proj.weight"])


def test_concat_fp8_keeps_rows_and_refuses_misaligned_blocks() -> None:
    w = torch.randn(64, 64).to(torch.float8_e4m3fn)
    a = Fp8Weight(w[:32], torch.rand(1, 2))
    b = Fp8Weight(w[32:], torch.rand(1, 2))
    fused = concat_fp8([a, b])
    assert torch.equal(fused.dequantize(), torch.cat((a.dequantize(), b.dequantize())))
    per_tensor = concat_fp8(
        [Fp8Weight(w[:8], torch.tensor(2.0)), Fp8Weight(w[8:], torch.tensor(3.0))]
    )
    assert torch.equal(per_tensor.dequantize()[:8], w[:8].float() * 2)
    with pytest.raises(ValueError, match="scale blocks"):
        concat_fp8([Fp8Weight(w[:48], torch.rand(2, 2)), Fp8Weight(w[48:], torch.rand(1, 2))])


@pytest.mark.gpu
def test_fp8_folder_stays_fp8_on_cuda(tmp_path: Path) -> None:
    expanded = fp8_folder(tmp_path)
    cuda = torch.device("cuda")
    _, model = load_model(tmp_path, torch.bfloat16, cuda, 64, quantization="keep")
    layer = model.layers[0]
    assert isinstance(layer.qkv_proj, Fp8Linear) and isinstance(layer.gate_up_proj, Fp8Linear)
    x = torch.randn(3, 64, device=cuda, dtype=torch.bfloat16)
    prefix = "model.layers.0.mlp."
    want = torch.cat([expanded[prefix + p + "_proj.weight"] for p in ("gate", "up")]).to(cuda)
    got = layer.gate_up_proj(x).float()
    ref = x.float() @ want.T
    assert (got - ref).abs().max() <= 2e-2 * ref.abs().max()
    one = layer.gate_up_proj(x[:1]).float()  # the decode GEMV
    assert (one - ref[:1]).abs().max() <= 2e-2 * ref[:1].abs().max()
