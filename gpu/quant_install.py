"""Put quantized weights into a DecoderModel in place of its dense parameters, fusing as the
model does (q|k|v -> qkv_proj, gate|up -> gate_up_proj). Called before `fill_weights`, which
then fills only the parameters left (norms, biases, anything shipped dense)."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from torch import nn
from troupe.gpu.cpu_q4lib import Q4Lib
from troupe.gpu.fp8_weights import Fp8Weight, concat_fp8
from troupe.gpu.gguf_quant import QuantBlocks, concat_rows
from troupe.gpu.gptq_awq_unpack import PermutedInt4, shared_input_order
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.models import DecoderModel
from troupe.gpu.quant_linear import QuantLinear, make_quant_linear
from troupe.gpu.text_part import text_name

# HF module name in a layer -> (the layer's fused parameter, parts in row order)
_FUSED = {
    "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "o_proj": ("self_attn.o_proj",),
    "down_proj": ("mlp.down_proj",),
}


def install_quantized(
    model: DecoderModel,
    tensors: Iterable[tuple[str, QuantBlocks | Fp8Weight | PermutedInt4]],
    q4: Q4Lib | None = None,
) -> set[str]:
    """Replace every parameter whose parts all come in `tensors` (HF names, read as they are
    yielded; a multimodal checkpoint's text-model names too); returns the names used, as
    `tensors` gave them. A fused parameter with only some parts quantized, or a
    form with no packed path on the model's device, stays dense: the loader expands those.
    Each layer's parts are fused and repacked as soon as the last one arrives, so only one
    layer's worth of file blocks is held at a time. `q4`: the native CPU 4-bit kernel, if any.
    Parts of one fused parameter must share their input order (GPTQ act-order): else a
    ModelLoadError names them."""
    used: set[str] = set()
    device = model.device
    groups: dict[str, tuple[nn.Module, str, list[str]]] = {}  # part -> its fused parameter
    for index, layer in enumerate(model.layers):
        for param, parts in _FUSED.items():
            names = [f"model.layers.{index}.{part}.weight" for part in parts]
            groups.update((name, (layer, param, names)) for name in names)
    tops = {"model.embed_tokens.weight": "embed_tokens"}
    if model.lm_head is not None:  # tied embeddings: embed_tokens serves both
        tops["lm_head.weight"] = "lm_head"
    pending: dict[str, QuantBlocks | Fp8Weight | PermutedInt4] = {}
    # The vocabulary's int8 layer (fbgemm's prepack: ~0.4 s of CPU that releases the GIL) is
    # built in a second thread, from when the file yields it (first, in llama.cpp's order),
    # while this one reads and repacks the layers
    with ThreadPoolExecutor(1, thread_name_prefix="weight-pack") as pool:
        made: dict[str, Future[QuantLinear | None]] = {}
        raw: dict[str, str] = {}  # text-model name -> the checkpoint's (gpu/text_part.py)
        for shipped, blocks in tensors:
            name = text_name(shipped)
            if name is None:
                continue
            raw[name] = shipped
            if name in tops:
                (table,), table_perm = shared_input_order([blocks], [name])
                made[name] = pool.submit(make_quant_linear, table, device, q4, table_perm)
                continue
            if name not in groups:
                continue
            pending[name] = blocks
            layer, param, names = groups[name]
            if not all(part in pending for part in names):
                continue
            arrived, in_perm = shared_input_order([pending.pop(part) for part in names], names)
            try:
                fused = concat_parts(arrived)
            except ValueError:
                continue  # mixed forms: leave them to the dense path
            weight = make_quant_linear(fused, device, q4, in_perm)
            if weight is not None:
                replace_dense(layer, param, weight, f"tensor {names[0]!r}")
                used.update(raw[part] for part in names)
    for name, future in made.items():
        top = future.result()
        if top is not None:
            replace_dense(model, tops[name], top, f"tensor {name!r}")
            used.add(raw[name])
    return used


def concat_parts(parts: list[QuantBlocks | Fp8Weight]) -> QuantBlocks | Fp8Weight:
    """Parts of one fused parameter stacked along N; ValueError where forms or scale blocks
    mix (the dense path expands those)."""
    fp8 = [p for p in parts if isinstance(p, Fp8Weight)]
    if not fp8:
        return concat_rows([p for p in parts if not isinstance(p, Fp8Weight)])
    if len(fp8) != len(parts):
        raise ValueError("cannot fuse fp8 with GGUF blocks")
    return concat_fp8(fp8)


def replace_dense(module: nn.Module, attr: str, weight: QuantLinear, what: str) -> None:
    """`module.attr` (a dense parameter) becomes `weight`; `what` names it in the error
    raised when the shapes differ."""
    dense = module._parameters.pop(attr)
    assert dense is not None
    if tuple(dense.shape) != tuple(weight.shape):
        raise ModelLoadError(
            f"{what} fuses to shape {tuple(weight.shape)}, expected {tuple(dense.shape)}"
        )
    setattr(module, attr, weight)
