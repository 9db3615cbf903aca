"""DeepSeek-V2 / V3 config.json: multi-head latent attention (MLA) and the grouped-routed MoE.

Parsed and checked here into ModelConfig fields (`deepseek_model_fields`); the model is
gpu/mla_layer.py (attention) and gpu/deepseek_moe.py (experts) inside DecoderModel.

    MLA       q_lora_rank (None: a plain q_proj), kv_lora_rank, qk_nope_head_dim,
              qk_rope_head_dim, v_head_dim; the cache holds kv_lora_rank + qk_rope_head_dim
              values per token (512 + 64 for DeepSeek-V2-Lite, one vector for all heads)
    RoPE      rope_scaling (or rope_parameters) of type yarn: the softmax scale is multiplied
              by yarn_mscale(factor, mscale_all_dim) ** 2, as transformers does
    MoE       n_routed_experts, n_shared_experts (one MLP of n_shared * moe_intermediate_size),
              num_experts_per_tok, n_group / topk_group, topk_method (V3: noaux_tc with
              e_score_correction_bias), routed_scaling_factor, norm_topk_prob (V3 only, as in
              transformers); layers before first_k_dense_replace are dense, then every
              moe_layer_freq-th
    MTP       num_nextn_predict_layers: the multi-token-prediction layers after the last
              decoder layer are skipped (their weights ignored, gpu/weight_fill.py logs it)
    RoPE layout  DeepSeek-V2 rotates interleaved pairs (x0, x1), (x2, x3) ... (transformers'
              complex product); V3 too unless rope_interleave is false, then halves (rotate_half)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from troupe.gpu.moe_config import MoeConfig, grouped_moe_fields

DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MlaConfig:
    num_heads: int
    q_lora_rank: int  # 0: q_proj straight from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool
    rope_scaling: dict[str, Any] | None  # yarn parameters, None without scaling

    @property
    def latent_size(self) -> int:
        """Cache values per token (all heads): the latent vector and the rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        scale = 1.0 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)
        mscale_all_dim = (self.rope_scaling or {}).get("mscale_all_dim", 0)
        if self.rope_scaling and mscale_all_dim:
            mscale = yarn_mscale(float(self.rope_scaling["factor"]), float(mscale_all_dim))
            scale *= mscale * mscale
        return scale


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "yarn":
        raise ValueError(f"config.json: rope_scaling type {kind!r} is not supported; expected yarn")
    if "factor" not in scaling:
        raise ValueError("config.json: rope_scaling of type yarn needs 'factor'")
    return {k: v for k, v in scaling.items() if k != "rope_theta"}


def deepseek_fields(cfg: dict[str, Any], num_layers: int) -> tuple[MlaConfig, MoeConfig | None]:
    """The MLA and MoE shape of a deepseek_v2 / deepseek_v3 config.json (ValueError naming the
    field when one is missing or out of range)."""
    model_type = cfg.get("model_type")
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if not cfg.get(key):
            raise ValueError(f"config.json: {model_type} needs a positive {key!r}")
    mla = MlaConfig(
        num_heads=int(cfg["num_attention_heads"]),
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        rope_interleave=model_type == "deepseek_v2" or bool(cfg.get("rope_interleave", True)),
        rope_scaling=_rope_scaling(cfg),
    )
    return mla, grouped_moe_fields(cfg, num_layers)


def deepseek_model_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """ModelConfig fields of a DeepSeek config.json beyond the common ones (ValueError naming the
    field when unsupported). head_dim is the rope dim, as transformers sets it: the rotary table
    is built for it."""
    if cfg.get("attention_bias"):
        raise ValueError(
            f"config.json: {cfg.get('model_type')} with attention_bias is not supported"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: hidden_act {cfg.get('hidden_act')!r} is not supported")
    mla, moe = deepseek_fields(cfg, num_layers)
    return {
        "mla": mla,
        "moe": moe,
        "num_kv_heads": mla.num_heads,
        "head_dim": mla.qk_rope_head_dim,
        "rope_scaling": mla.rope_scaling,
        "num_mtp_layers": int(cfg.get("num_nextn_predict_layers") or 0),
    }
