"""Loading an EAGLE-3 head (vLLM's Eagle3LlamaForCausalLM) as its checkpoints ship, e.g.
yuhuili/EAGLE3-LLaMA3.1-Instruct-8B:

    config.json   a one-layer Llama config (architectures LlamaForCausalLMEagle3) and
                  draft_vocab_size (default: vocab_size); optional
                  eagle_aux_hidden_state_layer_ids (default vLLM's (2, L // 2, L - 3) of the
                  model's L layers), norm_before_residual (false), target_hidden_size T
                  (default: hidden_size H; either way the model's hidden_size)
    tensors       fc.weight [H, 3T]          midlayer.* (or layers.0.*): layer 0, whose
    (`model.`     norm.weight [H]            q/k/v_proj take 2H inputs, with hidden_norm [H]
    optional)     lm_head.weight [Vd, H]     layers.N.*: further layers (width H)
                  (absent: the model's lm_head, as vLLM shares it: gpu/eagle_shared_lm_head.py,
                  so Vd = V and H = T)
                  d2t [Vd] ints: draft id d is target id d + d2t[d] (absent: the identity)
                  t2d [V] bools (optional): which target ids have a draft id; checked
                  embed_tokens.weight [V, H] (optional): else the model's, so required when
                  H differs from T (the model's rows are T wide; vLLM shares them unchecked)

The model's tapped states stay T wide (gpu/target_hidden.py); fc brings them to H once.
Refused by name: norm_before_fc (an RMSNorm over the taps before fc) and an fc.bias (vLLM's
fc has none either).
A folder is an EAGLE-3 head when its config names draft_vocab_size or an Eagle3
architecture, or its tensors hold midlayer.* or d2t (`is_eagle3`); one in the speculators
format arrives here as this layout (gpu/eagle_speculators.py). Refusals are ConfigErrors
naming draft_model's field or tensor and the sizes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from troupe.config import ConfigError
from troupe.gpu.eagle3_model import Eagle3Head
from troupe.gpu.eagle_shared_lm_head import Eagle3SharedHead
from troupe.gpu.head_weights import Destination, check_filled, fill, layer_destination, layer_keys
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, DecoderModel
from troupe.gpu.target_hidden import HiddenTaps

_AUX = "eagle_aux_hidden_state_layer_ids"


@dataclasses.dataclass(frozen=True)
class Eagle3Spec:
    """What an EAGLE-3 head's config.json says beyond a Llama config."""

    draft_vocab_size: int
    taps: HiddenTaps  # the model's layers whose residual stream fc reads
    target_hidden_size: int  # the width of each tapped state: the model's hidden_size
    norm_before_residual: bool = False


def is_eagle3(cfg: dict[str, Any], names: set[str]) -> bool:
    """Whether a head's config.json and tensor names are an EAGLE-3 head's."""
    architectures = cfg.get("architectures") or []
    return (
        "draft_vocab_size" in cfg
        or any("eagle3" in str(a).lower() for a in architectures)
        or any(n.startswith("midlayer.") for n in names)
        or "d2t" in names
    )


def eagle3_spec(cfg: dict[str, Any], head: ModelConfig, target: ModelConfig) -> Eagle3Spec:
    """The head's EAGLE-3 fields, checked against the model it reads."""
    if cfg.get("norm_before_fc"):
        raise ConfigError(
            "draft_model config.json: norm_before_fc true (an RMSNorm over the model's tapped "
            "states before fc, as gpt-oss heads have) is not supported"
        )
    vocab = target.vocab_size
    draft_vocab = int(cfg.get("draft_vocab_size") or vocab)
    if not 0 < draft_vocab <= vocab:
        raise ConfigError(
            f"draft_model config.json: draft_vocab_size {draft_vocab}, the model has {vocab} "
            "tokens (a draft vocabulary is a subset of the model's)"
        )
    width = _target_width(cfg, head, target)
    num_layers = target.num_layers
    given = cfg.get(_AUX)
    ids = given if given else (2, num_layers // 2, num_layers - 3)  # vLLM's default
    where = f"{_AUX} {list(ids)}" if given else f"the default aux layers {tuple(ids)}"
    for layer in ids:
        if not 0 <= int(layer) <= num_layers:
            raise ConfigError(
                f"draft_model config.json: {where} name layer {layer}; the model has "
                f"{num_layers} layers (ids 0..{num_layers}: the residual stream entering "
                "each, num_layers after the last)"
            )
    taps = HiddenTaps(tuple(sorted({int(i) for i in ids})))  # vLLM: ascending, once each
    return Eagle3Spec(draft_vocab, taps, width, bool(cfg.get("norm_before_residual", False)))


def _target_width(cfg: dict[str, Any], head: ModelConfig, target: ModelConfig) -> int:
    """target_hidden_size (default: the head's hidden_size), which must be the model's."""
    given = cfg.get("target_hidden_size")
    if given is None:
        if head.hidden_size != target.hidden_size:
            raise ConfigError(
                f"draft_model config.json: hidden_size {head.hidden_size} and no "
                f"target_hidden_size, the model has hidden_size {target.hidden_size} (a head "
                "of another width names the model's in target_hidden_size)"
            )
        return head.hidden_size
    if int(given) != target.hidden_size:
        raise ConfigError(
            f"draft_model config.json: target_hidden_size {given}, the model has hidden_size "
            f"{target.hidden_size}"
        )
    return int(given)


def build_eagle3(
    folder: Path,
    cfg: dict[str, Any],
    head_config: ModelConfig,
    target_config: ModelConfig,
    target: DecoderModel,
    tensors: dict[str, torch.Tensor],
    max_model_len: int,
) -> tuple[Eagle3Head, HiddenTaps]:
    """The loaded head and the states it needs of the model's forward."""
    spec = eagle3_spec(cfg, head_config, target_config)
    tensors = {_layer_name(name): t for name, t in tensors.items()}
    own_embedding = "embed_tokens.weight" in tensors
    own_lm_head = "lm_head.weight" in tensors
    _check_widths(head_config, spec, tensors.get("fc.weight"), own_embedding)
    if "fc.bias" in tensors:
        raise ConfigError(
            "draft_model tensor 'fc.bias': an EAGLE-3 head's fc has no bias (vLLM's neither)"
        )
    num_taps, nbr = len(spec.taps.layer_ids), spec.norm_before_residual
    head: Eagle3Head
    if own_lm_head:
        head = Eagle3Head(
            head_config,
            target,
            max_positions=max_model_len,
            num_taps=num_taps,
            target_hidden_size=spec.target_hidden_size,
            draft_vocab_size=spec.draft_vocab_size,
            norm_before_residual=nbr,
            own_embedding=own_embedding,
        )
    else:
        _check_shared_lm_head(head_config, spec, target_config, tensors.get("d2t"))
        head = Eagle3SharedHead(
            head_config,
            target,
            max_positions=max_model_len,
            num_taps=num_taps,
            norm_before_residual=nbr,
            own_embedding=own_embedding,
        )
    h = head_config.hidden_size
    filled = fill(tensors, {n: _destination(head, n) for n in tensors}, h)
    required = ["fc.weight", "norm.weight", "layers.0.hidden_norm.weight"]
    required += ["lm_head.weight"] if own_lm_head else []
    required += [] if head.embed_tokens is None else ["embed_tokens.weight"]
    layers = [layer for layer in head.layers if isinstance(layer, DecoderLayer)]
    check_filled(folder, required + layer_keys(layers), filled)
    _read_mapping(head, tensors.get("d2t"), tensors.get("t2d"))
    return head.eval(), spec.taps


def _check_widths(
    head: ModelConfig, spec: Eagle3Spec, fc: torch.Tensor | None, own_embedding: bool
) -> None:
    """fc.weight [H, taps * T] and an embedding H wide: ConfigErrors naming both sizes."""
    h, t, ids = head.hidden_size, spec.target_hidden_size, spec.taps.layer_ids
    if fc is not None and tuple(fc.shape) != (h, len(ids) * t):
        reads = f" (it reads {fc.shape[1] / t:g} states of {t})" if fc.dim() == 2 else ""
        raise ConfigError(
            f"draft_model tensor 'fc.weight' has shape {tuple(fc.shape)}{reads}, the head "
            f"needs ({h}, {len(ids) * t}): hidden_size {h} from the {len(ids)} tapped layers "
            f"{ids} ({_AUX}) of target_hidden_size {t}"
        )
    if h != t and not own_embedding:
        raise ConfigError(
            f"draft_model ships no 'embed_tokens.weight': the model's embedding is {t} wide "
            f"(target_hidden_size {t}), the head's hidden_size is {h}; a head of another "
            "width than the model needs its own embedding"
        )


def _check_shared_lm_head(
    head: ModelConfig, spec: Eagle3Spec, target: ModelConfig, d2t: torch.Tensor | None
) -> None:
    """A head without lm_head.weight takes the model's: ConfigErrors naming both sizes where
    its rows cannot be the model's (another vocabulary, another width, a moving d2t)."""
    why = "ships no 'lm_head.weight', so the model's lm_head makes its logits (as vLLM's)"
    if spec.draft_vocab_size != target.vocab_size:
        raise ConfigError(
            f"draft_model {why}: its draft_vocab_size {spec.draft_vocab_size} must be the "
            f"model's vocab_size {target.vocab_size}"
        )
    if head.hidden_size != target.hidden_size:
        raise ConfigError(
            f"draft_model {why}: its hidden_size {head.hidden_size} must be the model's "
            f"hidden_size {target.hidden_size}"
        )
    if d2t is not None and bool(d2t.ne(0).any()):
        raise ConfigError(
            f"draft_model {why}: its 'd2t' must map every draft id to itself (the model's "
            f"lm_head's rows are the model's {target.vocab_size} token ids)"
        )


def _layer_name(name: str) -> str:
    """EAGLE-3's `midlayer.` is layer 0."""
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def _destination(head: Eagle3Head, name: str) -> Destination | None:
    own = {
        "fc.weight": head.fc,
        "norm.weight": head.norm,
        "lm_head.weight": head.lm_head,
        "layers.0.hidden_norm.weight": head.hidden_norm,
        "embed_tokens.weight": head.embed_tokens,
    }
    if name in own:
        found = own[name]
        return None if found is None else (found, name)
    layers = [layer for layer in head.layers if isinstance(layer, DecoderLayer)]
    return layer_destination(layers, name)


@torch.inference_mode()
def _read_mapping(head: Eagle3Head, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> None:
    """Draft id -> target id from d2t (offsets), checked: in range, distinct, as t2d says."""
    mapping = head.get_buffer("draft_to_target")
    draft_vocab, vocab = len(mapping), head.vocab_size
    if d2t is not None:
        if tuple(d2t.shape) != (draft_vocab,) or d2t.is_floating_point():
            raise ConfigError(
                f"draft_model tensor 'd2t' has shape {tuple(d2t.shape)} ({d2t.dtype}), the "
                f"head needs ({draft_vocab},) integers (draft_vocab_size {draft_vocab})"
            )
        mapping.add_(d2t.to(mapping.device, torch.int64))
    ids = mapping.cpu()
    if int(ids.min()) < 0 or int(ids.max()) >= vocab or len(set(ids.tolist())) != draft_vocab:
        raise ConfigError(
            f"draft_model tensor 'd2t' maps draft ids outside the model's {vocab} tokens or "
            "two draft ids to one target id"
        )
    if t2d is None:
        return
    shipped = t2d.bool().cpu()
    if tuple(t2d.shape) != (vocab,) or int(shipped.sum()) != draft_vocab or not shipped[ids].all():
        raise ConfigError(
            f"draft_model tensor 't2d' (shape {tuple(t2d.shape)}, {int(shipped.sum())} set) "
            f"disagrees with 'd2t' ({draft_vocab} draft ids over the model's {vocab} tokens)"
        )
