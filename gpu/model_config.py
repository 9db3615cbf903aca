"""ModelConfig: the shape of a decoder model, read from an HF config.json or GGUF metadata."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from troupe.gpu.classifier_config import ClassifierConfig, read_classifier
from troupe.gpu.deepseek_config import DEEPSEEK_TYPES, MlaConfig
from troupe.gpu.exaone_names import exaone_config
from troupe.gpu.family_fields import family_fields
from troupe.gpu.hf_families import (
    COHERE_TYPES,
    GEMMA_TYPES,
    HUNYUAN_TYPES,
    GraniteScales,
    bias_fields,
    layer_windows,
)
from troupe.gpu.hf_overrides import apply_hf_overrides
from troupe.gpu.moe_config import MoeConfig
from troupe.gpu.rope_layers import check_longrope, head_order, partial_rotary_fields, rope_scaling
from troupe.gpu.text_part import text_config

SUPPORTED_MODEL_TYPES = (
    "llama",
    "exaone",  # Llama's layers under GPT-2's names (gpu/exaone_names.py)
    "arcee",  # Llama's layers with Nemotron's MLP
    "apertus",
    "mistral",
    "ministral",
    "ministral3",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen2_moe",
    "mixtral",
    "phi3",
    "granite",
    "granitemoe",
    "helium",
    "internlm3",  # Llama's layers (transformers runs them with LlamaForCausalLM)
    "iquestcoder",  # the same
    "cwm",  # Llama's layers with layer_types windows (Meta's Code World Model)
    "olmo2",
    "olmo3",
    "olmoe",
    "smollm3",
    "glm",
    "glm4",
    "glm4_moe",
    "dots1",
    "exaone4",
    "ernie4_5",
    "ernie4_5_moe",
    "seed_oss",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gpt_oss",
    *COHERE_TYPES,
    "starcoder2",
    "nemotron",
    *HUNYUAN_TYPES,
    "minimax_m2",
    *DEEPSEEK_TYPES,
)


# families whose transformers config ties the embeddings unless config.json says otherwise
TIED_BY_DEFAULT = ("ernie4_5", "ernie4_5_moe", *COHERE_TYPES)


class ModelLoadError(ValueError):
    """A model file is missing or malformed; the message names the file and what was expected."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Everything the decoder module needs to know about a Llama/Mistral/Qwen2/Qwen3/Gemma 3
    text model (gpu/hf_families.py reads the windows and Gemma's fields)."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # llama3: factor, low/high_freq_factor, ...
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # qwen2
    o_bias: bool = False  # o_proj's bias (attention_bias of Llama, Qwen3, ...; Seed-OSS's own)
    mlp_bias: bool = False  # gate/up/down biases (mlp_bias of Llama, Granite, SmolLM3, Seed-OSS)
    qk_norm: bool = False  # qwen3
    clip_qkv: float | None = None  # OLMoE: q, k and v clamped to +-clip_qkv after the q/k norm
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: torch.dtype = torch.float32
    layer_windows: tuple[int, ...] = ()  # per layer sliding window (0: full); (): none
    hidden_act: str = "silu"  # "silu" (SwiGLU), "gelu_tanh" (GeGLU; StarCoder2's, ungated), "relu2"
    query_pre_attn_scalar: float | None = None  # softmax scale ** -2 when not head_dim
    rope_local_theta: float | None = None  # RoPE base of the windowed layers (Gemma 3, OLMo 3)
    nope_layers: tuple[bool, ...] = ()  # per layer: no RoPE (SmolLM3); (): every layer rotates
    rotary_dim: int = 0  # dims of a head RoPE rotates (partial_rotary_factor); 0: all
    rope_interleaved: bool = False  # pairs (2i, 2i + 1) rotate together (GLM-4), not halves
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None  # Gemma 2's cap on the attention scores
    attention_sinks: bool = False  # GPT-OSS: a learned sink logit per head (kernels/sinks.py)
    # Ministral 3: queries times 1 + beta * log(1 + position // length) (gpu/query_scale.py)
    query_scale: tuple[float, int] | None = None
    granite: GraniteScales | None = None  # Granite's multipliers (gpu/hf_families.py)
    logit_scale: float | None = None  # Cohere's: the logits times it
    moe: MoeConfig | None = None  # experts (Qwen3-MoE, gpu/moe_config.py); None: dense MLPs
    mla: MlaConfig | None = None  # latent attention (DeepSeek, gpu/deepseek_config.py)
    num_mtp_layers: int = 0  # multi-token-prediction layers in the checkpoint, skipped
    # a *ForSequenceClassification checkpoint's score head (gpu/classifier_config.py)
    classifier: ClassifierConfig | None = None
    text_of: str | None = None  # the multimodal wrapper it was read from (gpu/text_part.py)

    @property
    def is_gemma(self) -> bool:
        """A Gemma: (1 + weight) norms, embeddings times sqrt(hidden), GeGLU."""
        return self.model_type in GEMMA_TYPES

    @property
    def layer_norm(self) -> bool:
        """LayerNorms (gpu/layer_norm.py; rms_norm_eps is their eps), not RMSNorm: Cohere's,
        and StarCoder2's and Nemotron's, which have biases too (`norm_bias`)."""
        return self.model_type in (*COHERE_TYPES, "starcoder2", "nemotron")

    @property
    def scales_queries(self) -> bool:
        """The rotated queries are scaled in DecoderLayer.scale_queries: Ministral 3's by
        position, HunYuan's by its q / k norm weights (gpu/hunyuan_layer.py)."""
        return self.query_scale is not None or self.model_type in HUNYUAN_TYPES

    @property
    def gated_mlp(self) -> bool:
        """The MLP is gate|up -> act * up -> down; not StarCoder2's, Nemotron's, Arcee's and
        Apertus's, whose one input matrix goes through the activation alone
        (gpu/starcoder2_layer.py)."""
        return self.model_type not in ("starcoder2", "nemotron", "arcee", "apertus")

    @property
    def norm_bias(self) -> bool:
        """The norms add a bias (StarCoder2's, Nemotron's; DecoderModel.norm_bias is the final
        norm's)."""
        return self.model_type in ("starcoder2", "nemotron")

    @property
    def sandwich_norms(self) -> bool:
        """Gemma 2 and 3: norms before and after attention and the MLP (gpu/gemma3_layer.py)."""
        return self.model_type in ("gemma2", "gemma3_text")

    @property
    def kv_window(self) -> int:
        """The widest window when every layer has one (KV behind it is dead), else 0."""
        windowed = len(self.layer_windows) == self.num_layers and all(self.layer_windows)
        return max(self.layer_windows) if windowed else 0

    def final_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The lm_head's logits as the model hands them out: Granite's divided by
        logits_scaling, Cohere's times logit_scale, Gemma's soft-capped (in fp32)."""
        if self.granite is not None:
            logits = logits / self.granite.logits
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        cap = self.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits.float() / cap) * cap

    def window_of(self, layer: int) -> int:
        """The sliding window of a layer in tokens, 0 for full attention."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def is_sparse(self, layer: int) -> bool:
        """Whether the layer's MLP is a mixture of experts."""
        return self.moe is not None and self.moe.sparse_layers[layer]

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"model_type {self.model_type!r} is not supported; "
                f"expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelLoadError(
                f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers"
            )
        if self.nope_layers and len(self.nope_layers) != self.num_layers:
            raise ModelLoadError(
                f"nope_layers has {len(self.nope_layers)} entries for {self.num_layers} layers"
            )
        if self.moe is not None and len(self.moe.sparse_layers) != self.num_layers:
            raise ModelLoadError(
                f"moe.sparse_layers has {len(self.moe.sparse_layers)} entries for "
                f"{self.num_layers} layers"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def rope_dim(self) -> int:
        """The dims of a head that RoPE rotates."""
        return self.rotary_dim or self.head_dim

    @property
    def head_order(self) -> tuple[int, ...] | None:
        """How q/k dims are reordered at load for the kernels' rotation (gpu/rope_layers.py)."""
        return head_order(self.head_dim, self.rope_dim, self.rope_interleaved)

    @property
    def kv_cache_planes(self) -> int:
        """Tensors per layer in the KV pool: key and value (2), or MLA's latent alone (1)."""
        return 1 if self.mla is not None else 2

    @property
    def kv_cache_heads(self) -> int:
        """Heads per token in one plane: the KV heads, or 1 (MLA's latent is shared by all)."""
        return 1 if self.mla is not None else self.num_kv_heads

    @property
    def kv_cache_head_dim(self) -> int:
        """Values per cached head: head_dim, or MLA's kv_lora_rank + qk_rope_head_dim."""
        return self.mla.latent_size if self.mla is not None else self.head_dim

    @property
    def kv_values_per_token(self) -> int:
        """Cache values one token takes in one layer: all the pools need to know of a model."""
        return self.kv_cache_planes * self.kv_cache_heads * self.kv_cache_head_dim

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_dict(
        cls, cfg: dict[str, Any], generation_config: dict[str, Any] | None = None
    ) -> ModelConfig:
        """Build from the dict of an HF config.json (transformers 4 or 5 spelling); a
        multimodal wrapper's text model (gpu/text_part.py)."""
        cfg = exaone_config(text_config(cfg) or cfg)
        model_type = cfg.get("model_type", "")
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        default_rotary = 0.5 if model_type == "nemotron" else 1.0  # transformers' defaults
        rotary = float(
            cfg.get(
                "partial_rotary_factor", rope_params.get("partial_rotary_factor", default_rotary)
            )
        )
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos: list[int] = []
        for source in (generation_config or {}, cfg):
            value = source.get("eos_token_id")
            for token in value if isinstance(value, list) else [value]:
                if isinstance(token, int) and token not in eos:
                    eos.append(token)
        dtype_name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
        num_layers = int(cfg["num_hidden_layers"])
        try:
            # Gemma 3's, OLMo 3's and DeepSeek's scaling are read by their families
            scaling: dict[str, Any] | None = None
            if model_type not in ("gemma3_text", "olmo3", *DEEPSEEK_TYPES):
                scaling = rope_scaling(cfg.get("rope_scaling") or rope_params, cfg)
            classifier = read_classifier(cfg)
            windows = layer_windows(cfg, model_type, num_layers)
            family = family_fields(cfg, model_type, num_layers, windows, float(rope_theta))
            head_dim = int(cfg.get("head_dim") or hidden // num_heads)
            family |= partial_rotary_fields(rotary, head_dim, model_type)
            check_longrope(scaling, family.get("rotary_dim") or head_dim)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from exc
        fields: dict[str, Any] = dict(
            model_type=model_type,
            hidden_size=hidden,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=dict(scaling) if scaling else None,
            # a classifier ships no lm_head: its one drawn token goes through the embeddings
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT))
            or bool(classifier),
            **bias_fields(cfg, model_type),
            qk_norm=model_type in ("qwen3", "qwen3_moe", "exaone4", "dots1", "apertus", *HUNYUAN_TYPES)
            or (model_type == "glm4_moe" and bool(cfg.get("use_qk_norm", False))),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            eos_token_ids=tuple(eos),
            torch_dtype=getattr(torch, str(dtype_name), torch.float32),
            layer_windows=windows,
            classifier=classifier,
            text_of=cfg.get("text_of"),
        )
        return cls(**{**fields, **family})

    @classmethod
    def from_hf_folder(
        cls, folder: Path, hf_overrides: Mapping[str, Any] | None = None
    ) -> ModelConfig:
        """Read config.json (its keys in `hf_overrides` replaced: gpu/hf_overrides.py) and
        generation_config.json when present, of an HF model folder."""
        config_file = folder / "config.json"
        if not config_file.is_file():
            raise ModelLoadError(f"{config_file}: missing; an HF model folder needs config.json")
        cfg = apply_hf_overrides(read_json_object(config_file), hf_overrides)
        cfg = text_config(cfg) or cfg  # a multimodal wrapper's text model (gpu/text_part.py)
        for key in ("num_attention_heads", "hidden_size", "num_hidden_layers", "vocab_size"):
            if key not in cfg:
                raise ModelLoadError(f"{config_file}: missing required key {key!r}")
        gen_file = folder / "generation_config.json"
        gen = read_json_object(gen_file) if gen_file.is_file() else None
        return cls.from_hf_dict(cfg, gen)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path` (a model folder's config files); ModelLoadError naming the
    file when it cannot be read, does not parse, or holds no object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, or bytes that are not UTF-8
        raise ModelLoadError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data
