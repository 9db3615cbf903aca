"""The mixture-of-experts fields of an HF config.json (Qwen3-MoE, Mixtral; DeepSeek's and
GLM-4.5's grouped routing in `grouped_moe_fields`), read into a MoeConfig.

    qwen3_moe   num_experts (or num_local_experts), num_experts_per_tok, moe_intermediate_size,
                norm_topk_prob; layer i is sparse unless i is in mlp_only_layers or
                (i + 1) % decoder_sparse_step != 0; dense layers use intermediate_size.
    qwen2_moe   the same, plus a shared expert of shared_expert_intermediate_size that every
                token runs, its output times sigmoid(shared_expert_gate . x)
    mixtral     num_local_experts, num_experts_per_tok; every layer sparse, each expert
                intermediate_size wide; the top-k always renormalised (transformers'
                MixtralTopKRouter)
    olmoe       num_experts, num_experts_per_tok, norm_topk_prob (transformers' defaults: 64,
                8, off); every layer sparse, each expert intermediate_size wide
    gpt_oss     num_local_experts, num_experts_per_tok, intermediate_size; every layer sparse;
                the router (with a bias) takes the top-k logits, then their softmax; experts
                with biases and the clamped SwiGLU (swiglu_alpha, swiglu_limit:
                kernels/clamped_swiglu.py); quantization_config's quant_method "mxfp4"
                (OpenAI's files) marks them MXFP4, kept packed under quantization "keep"
                alone (gpu/weights.load_model clears the flag otherwise)
    ernie4_5_moe  moe_num_experts, moe_k, moe_num_shared_experts, moe_intermediate_size; layer i
                is sparse when (i + 1) % moe_layer_interval == 0 and i is within
                moe_layer_start_index..moe_layer_end_index (-1: the last); routed by softmax
                with the correction bias (kernels/moe_router.py), shared experts beside
    minimax_m2  num_local_experts, num_experts_per_tok, intermediate_size (an expert's); every
                layer sparse; sigmoid scores, the top-k picked with the correction bias and
                renormalised: DeepSeek-V3's noaux_tc over one group (kernels/moe_router.py)
    hunyuan_v1_moe  num_experts, moe_topk, moe_intermediate_size (each one number, or one per
                layer, alike); every layer sparse; the top-k always renormalised, the router
                in fp32 (transformers' HunYuanMoEV1Gate); beside the experts an ungated MLP of
                intermediate_size * num_shared_expert (unless use_mixed_mlp_moe is off)

The router is a softmax over every expert in fp32, the top-k of it, renormalised to sum 1 when
norm_topk_prob, then cast to the activations' dtype (transformers' Qwen3MoeTopKRouter).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from troupe.kernels.clamped_swiglu import ClampedSwiglu
from troupe.kernels.moe_router import GroupedRouting


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeConfig:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP
    num_shared_experts: int = 0  # DeepSeek: an MLP every token runs (gpu/deepseek_config.py)
    gated_shared_size: int = 0  # Qwen2-MoE: its shared expert's width, gated per token
    plain_shared_size: int = 0  # HunYuan: the width of its ungated MLP beside the experts
    routing: GroupedRouting | None = None  # DeepSeek's grouped routers; None: softmax top-k
    clamped: ClampedSwiglu | None = None  # GPT-OSS's experts (gpu/gpt_oss_layer.py)
    mxfp4: bool = False  # the experts kept as the checkpoint's MXFP4 (kernels/mxfp4.py)

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(
                f"config.json: num_experts_per_tok ({self.top_k}) must be in 1..num_experts "
                f"({self.num_experts})"
            )
        if self.intermediate_size <= 0:
            raise ValueError("config.json: moe_intermediate_size must be positive")


def qwen3_moe_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig | None:
    """The MoeConfig of a qwen3_moe or qwen2_moe config.json; None when it has no experts (all
    dense)."""
    num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    step = int(cfg.get("decoder_sparse_step", 1))
    if step <= 0:
        raise ValueError(f"config.json: decoder_sparse_step must be >= 1; got {step}")
    dense_only = {int(i) for i in cfg.get("mlp_only_layers") or ()}
    sparse = tuple(
        num_experts > 0 and i not in dense_only and (i + 1) % step == 0 for i in range(num_layers)
    )
    if not any(sparse):
        return None
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        if key not in cfg:
            raise ValueError(
                f"config.json: missing required key {key!r} for {cfg.get('model_type')}"
            )
    return MoeConfig(
        num_experts=num_experts,
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_layers=sparse,
        gated_shared_size=int(cfg.get("shared_expert_intermediate_size") or 0)
        if cfg.get("model_type") == "qwen2_moe"
        else 0,
    )


def ernie_moe_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig | None:
    """The MoeConfig of an ernie4_5_moe config.json (transformers' defaults where a key is
    missing); None when no layer has experts."""
    num_experts = int(cfg.get("moe_num_experts", 64) or 0)
    start, end = int(cfg.get("moe_layer_start_index", 1)), int(cfg.get("moe_layer_end_index", -1))
    end = num_layers - 1 if end == -1 else end
    interval = int(cfg.get("moe_layer_interval", 1))
    if interval <= 0:
        raise ValueError(f"config.json: moe_layer_interval must be >= 1; got {interval}")
    sparse = tuple(
        num_experts > 0 and (i + 1) % interval == 0 and start <= i <= end for i in range(num_layers)
    )
    if not any(sparse):
        return None
    shared = int(cfg.get("moe_num_shared_experts", 2) or 0)
    if shared and cfg.get("use_bias"):
        raise ValueError(
            "config.json: ERNIE 4.5 MoE's shared experts with use_bias are not supported"
        )
    top_k = int(cfg.get("moe_k", 6))
    routing = GroupedRouting(
        top_k=top_k,
        method="softmax_bias",
        norm_topk_prob=True,
        norm_min=float(cfg.get("moe_norm_min", 1e-12)),
    )
    return MoeConfig(
        num_experts=num_experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        norm_topk_prob=True,
        sparse_layers=sparse,
        num_shared_experts=shared,
        routing=routing,
    )


def olmoe_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig:
    """The MoeConfig of an olmoe config.json: experts in every layer."""
    return MoeConfig(
        num_experts=int(cfg.get("num_experts", 64)),
        top_k=int(cfg.get("num_experts_per_tok", 8)),
        intermediate_size=int(cfg["intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_layers=(True,) * num_layers,
    )


def gpt_oss_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig:
    """The MoeConfig of a gpt_oss config.json: biased experts in every layer (transformers'
    defaults where a key is missing)."""
    quant = cfg.get("quantization_config") or {}
    return MoeConfig(
        num_experts=int(cfg.get("num_local_experts", 128)),
        top_k=int(cfg.get("num_experts_per_tok", 4)),
        intermediate_size=int(cfg["intermediate_size"]),
        norm_topk_prob=True,
        sparse_layers=(True,) * num_layers,
        clamped=ClampedSwiglu(
            alpha=float(cfg.get("swiglu_alpha", 1.702)), limit=float(cfg.get("swiglu_limit", 7.0))
        ),
        mxfp4=isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "mxfp4",
    )


def mixtral_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig:
    """The MoeConfig of a mixtral config.json: experts in every layer."""
    for key in ("num_local_experts", "num_experts_per_tok"):
        if key not in cfg:
            raise ValueError(f"config.json: missing required key {key!r} for mixtral")
    return MoeConfig(
        num_experts=int(cfg["num_local_experts"]),
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate_size=int(cfg["intermediate_size"]),
        norm_topk_prob=True,
        sparse_layers=(True,) * num_layers,
    )


def grouped_moe_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig | None:
    """The MoeConfig of DeepSeek's experts (deepseek_v2, deepseek_v3), GLM-4.5's (glm4_moe) or
    dots.llm1's (dots1), both routed as DeepSeek-V3 routes: n_routed_experts in every
    moe_layer_freq-th layer from first_k_dense_replace on, grouped routing
    (kernels/moe_router.py), shared experts; None when no layer has experts."""
    model_type = cfg.get("model_type")
    glm = model_type == "glm4_moe"
    num_experts = int(cfg.get("n_routed_experts") or 0)
    first_dense = int(cfg.get("first_k_dense_replace", 1 if glm else 0) or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    sparse = tuple(
        num_experts > 0 and i >= first_dense and i % freq == 0 for i in range(num_layers)
    )
    if not any(sparse):
        return None
    top_k = cfg.get("num_experts_per_tok")
    if not top_k:
        raise ValueError(f"config.json: {model_type} with experts needs 'num_experts_per_tok'")
    groups = int(cfg.get("n_group") or 1)
    if num_experts % groups:
        raise ValueError(
            f"config.json: n_routed_experts ({num_experts}) must be a multiple of n_group ({groups})"
        )
    sigmoid = glm or model_type in ("deepseek_v3", "dots1")
    routing = GroupedRouting(
        top_k=int(top_k),
        num_groups=groups,
        topk_groups=int(cfg.get("topk_group") or 1),
        method="noaux_tc" if sigmoid else str(cfg.get("topk_method") or "greedy"),
        norm_topk_prob=sigmoid and bool(cfg.get("norm_topk_prob", glm)),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
    )
    return MoeConfig(
        num_experts=num_experts,
        top_k=int(top_k),
        intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        norm_topk_prob=routing.norm_topk_prob,
        sparse_layers=sparse,
        num_shared_experts=int(cfg.get("n_shared_experts") or 0),
        routing=routing,
    )


def _one_for_all(cfg: dict[str, Any], key: str, default: Any, num_layers: int) -> int:
    """A HunYuan key given as one number or one per layer: the number (a list must hold one
    value for every layer; per-layer values are refused by name)."""
    value = cfg.get(key, default)
    if not isinstance(value, list):
        return int(value)
    if len(value) != num_layers or len(set(value)) != 1:
        raise ValueError(
            f"config.json: {key} must be one number, or the same number for each of the "
            f"{num_layers} layers; got {value}"
        )
    return int(value[0])


def hunyuan_moe_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig:
    """The MoeConfig of a hunyuan_v1_moe config.json (transformers' defaults where a key is
    missing: one expert, top-1)."""
    inter = int(cfg.get("intermediate_size", 11008))
    shared = 0
    if cfg.get("use_mixed_mlp_moe", True):
        shared = inter * _one_for_all(cfg, "num_shared_expert", 1, num_layers)
    return MoeConfig(
        num_experts=_one_for_all(cfg, "num_experts", 1, num_layers),
        top_k=_one_for_all(cfg, "moe_topk", 1, num_layers),
        intermediate_size=_one_for_all(cfg, "moe_intermediate_size", inter, num_layers),
        norm_topk_prob=True,
        sparse_layers=(True,) * num_layers,
        plain_shared_size=shared,
    )


def minimax_m2_moe_fields(cfg: dict[str, Any], num_layers: int) -> MoeConfig:
    """The MoeConfig of a minimax_m2 config.json (transformers' defaults where a key is
    missing); a scoring other than sigmoid, or shared experts, refused by name."""
    scoring = cfg.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise ValueError(f"config.json: scoring_func {scoring!r} is not supported; expected sigmoid")
    if int(cfg.get("shared_intermediate_size") or 0):
        raise ValueError("config.json: shared_intermediate_size (shared experts) is not supported")
    top_k = int(cfg.get("num_experts_per_tok", 8))
    return MoeConfig(
        num_experts=int(cfg.get("num_local_experts", 256)),
        top_k=top_k,
        intermediate_size=int(cfg.get("intermediate_size", 1536)),
        norm_topk_prob=True,
        sparse_layers=(True,) * num_layers,
        routing=GroupedRouting(top_k=top_k, method="noaux_tc", norm_topk_prob=True),
    )
