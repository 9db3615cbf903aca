"""HF-named tensors into a DecoderModel's parameters: q/k/v and gate/up into their fused
matrices (a checkpoint that ships them fused, Phi-3's qkv_proj and gate_up_proj, is split into
them first), layer subclasses' own weights (MoE experts, MLA) first, DeepSeek's multi-token-
prediction layers skipped; every parameter must be filled, Gemma's norms get their 1 folded in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import structlog
import torch
from troupe.gpu.gpt_oss_weights import gpt_oss_tensors
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.models import DecoderLayer, DecoderModel
from troupe.gpu.quant_linear import Weight
from troupe.gpu.rope_layers import ordered_tensors
from troupe.gpu.text_part import text_name

_log = structlog.get_logger("troupe.models")


def _dense(weight: Weight | None) -> torch.Tensor | None:
    """The parameter to copy a dense tensor into; None (skip) where a quantized weight sits."""
    return weight if isinstance(weight, torch.Tensor) else None


@torch.inference_mode()
def fill_weights(
    model: DecoderModel, tensors: Iterable[tuple[str, torch.Tensor]], source: str
) -> None:
    """Copy HF-named tensors into the fused parameters; every parameter must be filled."""
    c = model.config
    filled: set[str] = set()
    q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
    fused = {
        "self_attn.q_proj": ("qkv_proj", 0, q),
        "self_attn.k_proj": ("qkv_proj", q, kv),
        "self_attn.v_proj": ("qkv_proj", q + kv, kv),
        "mlp.gate_proj": ("gate_up_proj", 0, inter),
        "mlp.up_proj": ("gate_up_proj", inter, inter),
    }
    plain = {
        "input_layernorm.weight": "input_layernorm",
        "pre_feedforward_layernorm.weight": "pre_feedforward_layernorm",
        "post_feedforward_layernorm.weight": "post_feedforward_layernorm",
        "self_attn.o_proj.weight": "o_proj",
        "post_attention_layernorm.weight": "post_attention_layernorm",
        "mlp.down_proj.weight": "down_proj",
        "self_attn.o_proj.bias": "o_bias",
        "mlp.down_proj.bias": "down_bias",
        "self_attn.q_norm.weight": "q_norm",
        "self_attn.k_norm.weight": "k_norm",
        "self_attn.sinks": "sinks",
    }
    num_beyond = 0
    order = c.head_order  # partial or interleaved rotary: q/k dims reordered (rope_layers.py)
    if order is not None and not all(
        isinstance(layer, DecoderLayer) and isinstance(layer.qkv_proj, torch.Tensor)
        for layer in model.layers
    ):
        raise ModelLoadError(
            f"{source}: quantized q/k projections with partial_rotary_factor or interleaved "
            "rotary are not supported; run the unquantized checkpoint"
        )
    if c.model_type == "gpt_oss":  # experts in MoeLayer's layout; MXFP4 unpacked or kept
        keep = c.moe is not None and c.moe.mxfp4
        tensors = gpt_oss_tensors(tensors, model.norm.device, keep)
    split = _split_fused(_text_tensors(tensors), (q, kv, kv), (inter, inter))
    for name, tensor in ordered_tensors(split, order):
        if _beyond_last_layer(model, name):  # DeepSeek's multi-token-prediction layers
            num_beyond += 1
            continue
        # a layer subclass's own weights first: MLA's q_proj is not the fused qkv's
        extra = _locate_extra(model, name)
        target: torch.Tensor | None
        if extra is not None:
            target, start, size, keys = extra[0], None, 0, extra[1]
        else:
            target, start, size, key = _locate(model, name, fused, plain)
            keys = (key,)
        if target is None:
            continue  # e.g. rotary_emb.inv_freq in old checkpoints
        dest = target if start is None else target[start : start + size]
        if _experts_transposed(name, tensor, dest):  # Qwen3-VL-MoE's hub files
            tensor = tensor.transpose(1, 2)
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ModelLoadError(
                f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(dest.shape)} from the config"
            )
        dest.copy_(tensor)
        filled.update(keys)
    if num_beyond or c.num_mtp_layers:
        _log.info(
            "skipped multi-token-prediction layers",
            source=source,
            num_mtp_layers=c.num_mtp_layers,
            num_tensors_skipped=num_beyond,
        )
    missing = sorted(k for k in _required_keys(model) if k not in filled)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{source}: missing weights for {', '.join(missing[:5])}{more}")
    if c.is_gemma or c.model_type == "nemotron":  # (1 + weight) norms: fold the 1 in once
        for name, param in model.named_parameters():
            if name.endswith("norm") or name.endswith("layernorm"):
                param.add_(1.0)


def _experts_transposed(name: str, tensor: torch.Tensor, dest: torch.Tensor) -> bool:
    """Fused experts stored [E, H, 2I] / [E, I, H] (Qwen3-VL-MoE's hub checkpoints, which
    transformers transposes at load) where the layer holds [E, 2I, H] / [E, H, I]."""
    if not name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
        return False
    flipped = tensor.dim() == 3 and tuple(tensor.transpose(1, 2).shape) == tuple(dest.shape)
    return flipped and tuple(tensor.shape) != tuple(dest.shape)


def _text_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """A multimodal checkpoint's text-model tensors, renamed (gpu/text_part.py)."""
    for name, tensor in tensors:
        text = text_name(name)
        if text is not None:
            yield text, tensor


_FUSED_PARTS = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}  # fmt: skip


def _split_fused(
    tensors: Iterable[tuple[str, torch.Tensor]], qkv: tuple[int, ...], gate_up: tuple[int, ...]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors, a layer's fused q|k|v or gate|up rows (Phi-3's checkpoints) as their parts
    (`qkv`, `gate_up`: the parts' row counts; another total is left whole, and the fill names
    the shape it expected)."""
    for name, tensor in tensors:
        head, _, rest = name.partition(".layers.")
        index, _, local = rest.partition(".")
        parts = _FUSED_PARTS.get(local) if head == "model" and index.isdigit() else None
        sizes = qkv if local.startswith("self_attn") else gate_up
        if parts is None or tensor.shape[0] != sum(sizes):
            yield name, tensor
            continue
        for part, piece in zip(parts, torch.split(tensor, list(sizes)), strict=True):
            yield f"model.layers.{index}.{part}", piece


def _required_keys(model: DecoderModel) -> list[str]:
    """Fill keys fill_weights must see: one per plain parameter, one per fused slice."""
    slices = {
        "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "qkv_bias": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
        "gate_up_bias": ("mlp.gate_proj", "mlp.up_proj"),
    }
    keys = []
    for name, _ in model.named_parameters():
        last = name.rsplit(".", 1)[-1]
        keys += [f"{name}#{part}" for part in slices[last]] if last in slices else [name]
    for index, layer in enumerate(model.layers):
        assert isinstance(layer, DecoderLayer)
        for param, parts in layer.fill_parts().items():
            whole = f"layers.{index}.{param}"
            keys = [k for k in keys if k != whole] + [f"{whole}#{part}" for part in parts]
    return keys


def _beyond_last_layer(model: DecoderModel, name: str) -> bool:
    parts = name.split(".")
    return (
        len(parts) > 3
        and parts[:2] == ["model", "layers"]
        and parts[2].isdigit()
        and int(parts[2]) >= len(model.layers)
    )


def _locate_extra(model: DecoderModel, name: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
    """A layer subclass's weight (MoE experts and router): (destination, fill keys)."""
    parts = name.split(".")
    if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        return None
    layer = model.layers[int(parts[2])]
    assert isinstance(layer, DecoderLayer)
    return layer.locate_extra(".".join(parts[3:]), f"layers.{parts[2]}")


def _locate(
    model: DecoderModel, name: str, fused: dict[str, tuple[str, int, int]], plain: dict[str, str]
) -> tuple[torch.Tensor | None, int | None, int, str]:
    """HF name -> (destination tensor, slice start or None, slice size, fill key)."""
    if name == "model.embed_tokens.weight":
        return _dense(model.embed_tokens), None, 0, "embed_tokens"
    if name == "model.norm.weight":
        return model.norm, None, 0, "norm"
    if name == "model.norm.bias":  # a LayerNorm's (StarCoder2); None: a norm without, ignored
        return model.norm_bias, None, 0, "norm_bias"
    if name == "score.weight":  # a classifier's head; None: not a classifier, ignored
        return model.score, None, 0, "score"
    if name == "score.bias":  # a token classifier's; None: a head without one, ignored
        return model.score_bias, None, 0, "score_bias"
    if name == "lm_head.weight":
        return _dense(model.lm_head), None, 0, "lm_head"  # None when tied: ignored
    parts = name.split(".")
    if len(parts) < 5 or parts[:2] != ["model", "layers"]:
        return None, None, 0, ""
    index = int(parts[2])
    layer = model.layers[index]
    assert isinstance(layer, DecoderLayer)
    rest = ".".join(parts[3:])
    prefix = f"layers.{index}"
    if rest in plain:
        found: torch.Tensor | None = getattr(layer, plain[rest])
        return found, None, 0, f"{prefix}.{plain[rest]}"
    module, kind = rest.rsplit(".", 1)
    if module in fused:
        param, start, size = fused[module]
        if kind == "bias":  # qkv_proj -> qkv_bias, gate_up_proj -> gate_up_bias
            bias_name = param.replace("_proj", "_bias")
            bias: torch.Tensor | None = getattr(layer, bias_name)
            if bias is None:
                return None, None, 0, ""
            return bias, start, size, f"{prefix}.{bias_name}#{module}"
        dest: torch.Tensor = getattr(layer, param)
        return dest, start, size, f"{prefix}.{param}#{module}"
    return None, None, 0, ""
