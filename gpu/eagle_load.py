"""Loading an EAGLE head (speculative_method "eagle" or "eagle3", draft_model: the head's HF
folder): an EAGLE-1 head here, an EAGLE-3 head by gpu/eagle3_load.py (which it is: the
folder says, `is_eagle3`; "eagle3" refuses an EAGLE-1 folder).

An EAGLE-1 head ships as EAGLE's checkpoints do: config.json (a one-layer Llama/Qwen config)
and safetensors or pytorch_model*.bin with, names optionally under `model.`:

    fc.weight [H, 2H] (fc.bias [H] when shipped)      layers.N.*: decoder layers (q/k/v/o,
    embed_tokens.weight [V, H]: else the model's      gate/up/down, post_attention_layernorm;
    norm.weight [H]: optional final norm              layer 0's input_layernorm optional)

lm_head.weight, when shipped, is ignored: logits come from the model's lm_head (as in vLLM).
A head in the speculators format (config.json naming speculators_model_type, "eagle" or
"eagle3") is read as these layouts (gpu/eagle_speculators.py).
Every refusal is a ConfigError naming draft_model (or the model's field) and both sizes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Protocol

import torch
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.draft_model import check_draft
from troupe.gpu.eagle3_load import build_eagle3, is_eagle3
from troupe.gpu.eagle_model import EagleHead
from troupe.gpu.eagle_speculators import log_verifier, plain_config, plain_tensors
from troupe.gpu.head_weights import (
    Destination,
    check_filled,
    fill,
    head_tensors,
    layer_destination,
    layer_keys,
)
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, DecoderModel, KVCache
from troupe.gpu.pool_sizing import block_bytes
from troupe.gpu.target_hidden import HiddenTaps, TargetHidden
from troupe.speculators_format import speculators_fields

HEAD_TYPES = ("llama", "mistral", "qwen2", "qwen3")
FINAL_STATE = HiddenTaps()  # EAGLE-1 reads the final post-norm state


class DraftHead(Protocol):
    """A head as the runner drives it: EAGLE (gpu/eagle_model.py, gpu/eagle3_model.py) or
    DeepSeek's MTP layer (gpu/mtp_model.py, loaded by gpu/mtp_load.py)."""

    dtype: torch.dtype
    device: torch.device

    def set_kv_scales(self, scales: torch.Tensor | None) -> None: ...

    def combine(self, taps: torch.Tensor) -> torch.Tensor:
        """The target's tapped rows as the head's hidden input (EAGLE-3: fc)."""

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows' states for compute_logits, the hidden input of the next draft step)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, the model's vocabulary]."""


@dataclasses.dataclass(frozen=True)
class EagleModel:
    """A loaded EAGLE head or MTP layer, bound to its target (whose forward now fills
    target_hidden)."""

    config: ModelConfig  # the head's
    head: DraftHead
    target_hidden: TargetHidden

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes of one block of the head's pool: each target block id has one here too."""
        return block_bytes(self.config, block_size, dtype)


def check_eagle(target: ModelConfig, head: ModelConfig, *, eagle3: bool = False) -> None:
    """ConfigError when `head` cannot propose tokens for `target`. An EAGLE-3 head's width
    may differ from the model's (its target_hidden_size: gpu/eagle3_load.py checks it)."""
    if target.mla is not None or target.is_gemma:
        raise ConfigError(
            f"speculative_method 'eagle' needs a Llama/Qwen-style model; the model's "
            f"model_type is {target.model_type!r} (a DeepSeek-V3 checkpoint's own "
            "multi-token-prediction layer: speculative_method 'mtp')"
        )
    if head.model_type not in HEAD_TYPES or head.moe is not None:
        raise ConfigError(
            f"draft_model: an EAGLE head of model_type {head.model_type!r}; "
            f"expected one of {', '.join(HEAD_TYPES)} (dense layers)"
        )
    if not eagle3 and head.hidden_size != target.hidden_size:
        raise ConfigError(
            f"draft_model has hidden_size {head.hidden_size}, the model has "
            f"{target.hidden_size}: an EAGLE-1 head reads the model's hidden states"
        )
    check_draft(target, head)  # the vocabulary, the window


def _destination(head: EagleHead, name: str) -> Destination | None:
    """(where an HF-named tensor goes, its fill key); None: not the head's (lm_head, ...)."""
    own = {
        "fc.weight": head.fc,
        "fc.bias": head.fc_bias,
        "embed_tokens.weight": head.embed_tokens,
        "norm.weight": head.norm,
    }
    if name in own:
        found = own[name]
        return None if found is None else (found, name)
    return layer_destination(_layers(head.layers), name)


def _layers(modules: torch.nn.ModuleList) -> list[DecoderLayer]:
    return [layer for layer in modules if isinstance(layer, DecoderLayer)]


def load_eagle(
    config: EngineConfig,
    target_config: ModelConfig,
    target: DecoderModel,
    max_model_len: int,
    max_rows: int,
) -> EagleModel:
    """Read and check config.draft_model as an EAGLE head for `target`, load it, and have the
    target's forward keep what the head reads of every row (`max_rows` rows a step at most)."""
    assert config.draft_model is not None, "EngineConfig checks draft_model is set"
    folder = Path(config.draft_model).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"draft_model path {str(folder)!r} is not an EAGLE head's folder")
    speculators = speculators_fields(folder)  # None: the plain layouts
    if speculators is None:
        head_config = ModelConfig.from_hf_folder(folder)
        raw = json.loads((folder / "config.json").read_text())
    tensors = dict(head_tensors(folder))  # one read: the head is one layer (and an embedding)
    if speculators is not None:  # read as the plain layouts (gpu/eagle_speculators.py)
        raw, tensors = plain_config(speculators), plain_tensors(speculators, tensors)
        head_config = ModelConfig.from_hf_dict(raw)
        log_verifier(speculators, target_config)
    eagle3 = is_eagle3(raw, set(tensors))
    check_eagle(target_config, head_config, eagle3=eagle3)
    head: DraftHead
    if eagle3:
        head, taps = build_eagle3(
            folder, raw, head_config, target_config, target, tensors, max_model_len
        )
    elif config.speculative_method == "eagle3":
        why = "no draft_vocab_size in its config.json, no midlayer.* or d2t tensors"
        if speculators is not None:
            why = f"its speculators_model_type is {speculators['speculators_model_type']!r}"
        raise ConfigError(
            f"draft_model {str(folder)!r} is not an EAGLE-3 head ({why}): "
            "speculative_method 'eagle3' needs one"
        )
    else:
        head, taps = _build_eagle1(folder, head_config, target, tensors, max_model_len), FINAL_STATE
    hidden = TargetHidden(taps, max_rows, target_config.hidden_size, target.dtype, target.device)
    target.target_hidden = hidden  # before the runner captures the target's graphs
    return EagleModel(head_config, head, hidden)


def _build_eagle1(
    folder: Path,
    head_config: ModelConfig,
    target: DecoderModel,
    tensors: dict[str, torch.Tensor],
    max_model_len: int,
) -> EagleHead:
    names = set(tensors)
    head = EagleHead(
        head_config,
        target,
        max_positions=max_model_len,
        fc_bias="fc.bias" in names,
        input_norm="layers.0.input_layernorm.weight" in names,
        final_norm="norm.weight" in names,
        own_embedding="embed_tokens.weight" in names,
    )
    filled = fill(tensors, {n: _destination(head, n) for n in tensors}, head_config.hidden_size)
    required = ["fc.weight"]
    required += [] if head.fc_bias is None else ["fc.bias"]
    required += [] if head.norm is None else ["norm.weight"]
    required += [] if head.embed_tokens is None else ["embed_tokens.weight"]
    required += layer_keys(_layers(head.layers), first_input_norm=head.has_input_norm)
    check_filled(folder, required, filled)
    return head.eval()
