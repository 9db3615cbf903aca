"""What an HF config.json declares beyond the Llama shape: sliding windows, Gemma's fields and
Granite's multipliers.

Sliding windows, per layer (0: full attention), as transformers builds them:

    layer_types present        "sliding_attention" layers get `sliding_window`, others full
    mistral                    `sliding_window` (or none) on every layer
    qwen2 / qwen3              `use_sliding_window`: layers i >= max_window_layers get it
    smollm3                    `use_sliding_window` gates its layer_types
    gemma3_text                every `sliding_window_pattern`-th layer (1-based) is global
    gemma2                     the same, every 2nd
    gpt_oss                    every 2nd from layer 0 is windowed (when layer_types is absent)
    exaone4                    the same, or a pattern of letters ("LLLG": L local, G global)
                               repeated from layer 0
    cohere2                    every `sliding_window_pattern`-th (4th) layer is global

Gemma 3 text: attention scaled by query_pre_attn_scalar ** -0.5, GeGLU, embeddings times
sqrt(hidden), RMSNorm with (1 + weight), sandwich norms around attention and MLP, q/k norm,
local layers on their own RoPE base (rope_local_base_freq), final logit soft-capping. Gemma 2:
the same without the q/k norm, on one RoPE base, and with the attention scores soft-capped too
(attn_logit_softcapping: score -> cap * tanh(score / cap), kernels/softcap.py). Gemma (1):
Llama's pre-norm layer with Gemma's embeddings, norms and GeGLU.

Biases, as each family's transformers module declares them:

    q/k/v     qwen2 always, qwen2_moe by `qkv_bias` (default on); mistral, ministral,
              ministral3, mixtral, phi3, exaone4 never; the others `attention_bias` (gpt_oss: on by default)
    o_proj    seed_oss `attention_out_bias`; those without q/k/v bias flags, the Qwen2s,
              the GLMs (glm, glm4, glm4_moe) and helium never; the others `attention_bias`
    MLP       llama, granite, smollm3, seed_oss, helium, internlm3, iquestcoder, cwm, nemotron:
              `mlp_bias`; the others never (InternLM3's config.json may say `qkv_bias` and `bias` for
              Llama's `attention_bias` and `mlp_bias`, as transformers' attribute_map reads it)
    ernie4_5  `use_bias` on every projection (ernie4_5_moe too; starcoder2's on by default)

Cohere (Command R, R+, Aya) and Cohere 2 (Command R7B, A): LayerNorms without bias (eps:
layer_norm_eps; gpu/layer_norm.py), the logits times logit_scale, RoPE on interleaved pairs,
tied embeddings, Command R+'s q / k LayerNorm per head (use_qk_norm), and Cohere 2's global
layers without RoPE (as transformers' Cohere2Attention rotates only in its windowed layers).

StarCoder2: Mistral's attention (windows on every layer) with biases on every projection
(`use_bias`), LayerNorms with biases (eps: norm_epsilon), and a tanh-GELU MLP without a gate
(c_fc, c_proj; gpu/starcoder2_layer.py).

HunYuan dense (Hunyuan-0.5B to 7B): Llama's layers with q / k RMS-normalised per head after the
rotary (gpu/hunyuan_layer.py), and a "dynamic" rope whose fixed `alpha` moves the base. HunYuan
MoE (Hunyuan-A13B): the same attention over experts in every layer and an MLP beside them
(gpu/moe_config.hunyuan_moe_fields).

MiniMax-M2: Mixtral's layout with OLMo's whole-width q / k norms before a partial rotary
(`rotary_dim` of each head) and DeepSeek-V3's sigmoid routing in every layer
(gpu/minimax_m2_layer.py).

Arcee (AFM-4.5B): Llama's layers with Nemotron's MLP, up_proj -> relu(x)^2 -> down_proj
(gpu/starcoder2_layer.UngatedMlpLayer). Apertus: the same MLP with xIELU, under Qwen3's q / k
norms (gpu/apertus_layer.py).

Nemotron (Minitron, Nemotron-4): StarCoder2's layer under Llama's bias flags, with a squared
ReLU, LayerNorm1P norms (weight + 1) and RoPE on half of each head by default.

Granite: Llama's layers with four scalars (transformers' GraniteModel): the embeddings times
embedding_multiplier, the attention softmax scaled by attention_multiplier (not head_dim's
root), each layer's attention and MLP outputs times residual_multiplier before they join the
residual stream, and the logits divided by logits_scaling.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from troupe.gpu.moe_config import hunyuan_moe_fields, minimax_m2_moe_fields
from troupe.gpu.rope_layers import partial_rotary_fields


def layer_windows(cfg: dict[str, Any], model_type: str, num_layers: int) -> tuple[int, ...]:
    """Per layer sliding window in tokens (0: full attention); () when no layer has one."""
    window = cfg.get("sliding_window")
    qwen_kin = ("qwen2", "qwen2_moe", "qwen3", "smollm3")
    if model_type in qwen_kin and not cfg.get("use_sliding_window", False):
        window = None
    if not window:
        return ()
    window = int(window)
    types = cfg.get("layer_types")
    if types is not None:
        if len(types) != num_layers:
            raise ValueError(
                f"config.json: layer_types has {len(types)} entries, expected num_hidden_layers "
                f"({num_layers})"
            )
        windows = [window if kind == "sliding_attention" else 0 for kind in types]
    elif model_type in ("qwen2", "qwen2_moe", "qwen3", "dots1"):
        first = int(cfg.get("max_window_layers", num_layers))
        windows = [window if i >= first else 0 for i in range(num_layers)]
    elif model_type == "exaone4" and isinstance(cfg.get("sliding_window_pattern"), str):
        letters = cfg["sliding_window_pattern"].upper()
        if not letters or set(letters) - {"L", "G"}:
            raise ValueError(
                f"config.json: sliding_window_pattern {letters!r} is not made of L and G"
            )
        windows = [window if letters[i % len(letters)] == "L" else 0 for i in range(num_layers)]
    elif model_type == "gpt_oss":
        windows = [0 if i % 2 else window for i in range(num_layers)]
    elif model_type in ("gemma2", "gemma3_text", "exaone4", "cohere2"):
        default = {"gemma2": 2, "gemma3_text": 6}.get(model_type, 4)
        pattern = int(cfg.get("sliding_window_pattern", default))
        windows = [window if (i + 1) % pattern else 0 for i in range(num_layers)]
    else:
        windows = [window] * num_layers
    return tuple(windows) if any(windows) else ()


def gemma_fields(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """ModelConfig fields that Gemma (1), Gemma 2 and Gemma 3 text set differently (both
    config.json spellings; a key Gemma 2's config leaves out takes transformers' default)."""
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("config.json: use_bidirectional_attention is not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu"):  # HF's Gemmas run gelu as tanh-gelu too
        raise ValueError(f"config.json: hidden_activation {act!r} is not supported")
    tie = bool(cfg.get("tie_word_embeddings", True))
    if model_type == "gemma":  # the softmax scaled by head_dim's root, no caps
        return {"hidden_act": "gelu_tanh", "tie_word_embeddings": tie}
    gemma2 = model_type == "gemma2"
    cap = cfg.get("final_logit_softcapping", 30.0 if gemma2 else None)
    fields: dict[str, Any] = {
        "hidden_act": "gelu_tanh",
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar", 256)),
        "final_logit_softcapping": float(cap) if cap else None,
        "tie_word_embeddings": tie,
    }
    if gemma2:  # one RoPE base for every layer, read as any family's
        attn_cap = cfg.get("attn_logit_softcapping", 50.0)
        return fields | {"attn_logit_softcapping": float(attn_cap) if attn_cap else None}
    rope = cfg.get("rope_parameters") or {}
    full = dict(rope.get("full_attention") or {})
    local = dict(rope.get("sliding_attention") or {})
    theta = full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    local_theta = local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))
    scaling = cfg.get("rope_scaling") or {k: v for k, v in full.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = {}
    return fields | {
        "qk_norm": True,
        "rope_theta": float(theta),
        "rope_local_theta": float(local_theta),
        "rope_scaling": scaling or None,
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraniteScales:
    """Granite's four scalars (module docstring)."""

    embedding: float
    attention: float
    residual: float
    logits: float


def granite_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields of a granite config.json (transformers' defaults: 1.0 each)."""
    scales = GraniteScales(
        embedding=float(cfg.get("embedding_multiplier", 1.0)),
        attention=float(cfg.get("attention_multiplier", 1.0)),
        residual=float(cfg.get("residual_multiplier", 1.0)),
        logits=float(cfg.get("logits_scaling", 1.0)),
    )
    if scales.logits == 0:
        raise ValueError("config.json: logits_scaling must not be 0")
    return {"granite": scales}


_NO_ATTENTION_BIAS = ("mistral", "ministral", "ministral3", "mixtral", "phi3", "exaone4")
_MLP_BIAS = (
    "llama", "exaone", "arcee", "granite", "smollm3", "seed_oss", "helium", "internlm3", "iquestcoder", "cwm",
    "nemotron",
)  # fmt: skip
# InternLM3's own config.json names Llama's flags as its remote code did (transformers maps them)
_INTERNLM3_NAMES = {"qkv_bias": "attention_bias", "bias": "mlp_bias"}
_NO_O_BIAS = ("qwen2", "qwen2_moe", "glm", "glm4", "glm4_moe", "helium")


def bias_fields(cfg: dict[str, Any], model_type: str) -> dict[str, bool]:
    """ModelConfig's qkv_bias, o_bias and mlp_bias (module docstring)."""
    if model_type == "internlm3":
        cfg = {_INTERNLM3_NAMES.get(key, key): value for key, value in cfg.items()}
    if model_type in ("ernie4_5", "ernie4_5_moe", "starcoder2"):
        every = bool(cfg.get("use_bias", model_type == "starcoder2"))
        return {"qkv_bias": every, "o_bias": every, "mlp_bias": every}
    default = model_type == "gpt_oss"
    attention = bool(cfg.get("attention_bias", default)) and model_type not in _NO_ATTENTION_BIAS
    o_bias = attention and model_type not in _NO_O_BIAS
    if model_type == "seed_oss":
        o_bias = bool(cfg.get("attention_out_bias", False))
    return {
        "qkv_bias": model_type == "qwen2"
        or (model_type == "qwen2_moe" and bool(cfg.get("qkv_bias", True)))
        or attention,
        "o_bias": o_bias,
        "mlp_bias": model_type in _MLP_BIAS and bool(cfg.get("mlp_bias", False)),
    }


GEMMA_TYPES = ("gemma", "gemma2", "gemma3_text")
COHERE_TYPES = ("cohere", "cohere2")
HUNYUAN_TYPES = ("hunyuan_v1_dense", "hunyuan_v1_moe")


def cohere_fields(cfg: dict[str, Any], model_type: str, windows: tuple[int, ...]) -> dict[str, Any]:
    """ModelConfig's fields of a Cohere or Cohere 2 config.json (module docstring), given its
    layer windows."""
    fields: dict[str, Any] = {
        "rms_norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),
        "logit_scale": float(cfg.get("logit_scale", 0.0625)),
        "qk_norm": model_type == "cohere" and bool(cfg.get("use_qk_norm", False)),
    }
    if model_type == "cohere2":  # no window (no sliding_window at all): no layer rotates
        num_layers = int(cfg["num_hidden_layers"])
        fields["nope_layers"] = tuple(w == 0 for w in windows) if windows else (True,) * num_layers
    return fields


def starcoder2_fields(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """StarCoder2's and Nemotron's: their LayerNorms' eps (`norm_epsilon`, `norm_eps`) and
    their MLP's activation, which no gate multiplies (gpu/starcoder2_layer.py)."""
    nemotron = model_type == "nemotron"
    act = cfg.get("hidden_act", "relu2" if nemotron else "gelu_pytorch_tanh")
    if act != ("relu2" if nemotron else "gelu_pytorch_tanh"):
        raise ValueError(f"config.json: hidden_act {act!r} is not supported for {model_type}")
    eps = cfg.get("norm_eps" if nemotron else "norm_epsilon", 1e-5)
    return {"rms_norm_eps": float(eps), "hidden_act": "relu2" if nemotron else "gelu_tanh"}


def ungated_fields(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Arcee's and Apertus's: their MLP's activation, which no gate multiplies (Arcee's squared
    ReLU, Apertus's xIELU: the only ones troupe runs there)."""
    expected = "xielu" if model_type == "apertus" else "relu2"
    act = cfg.get("hidden_act", expected)
    if act != expected:
        raise ValueError(f"config.json: hidden_act {act!r} is not supported for {model_type}")
    return {"hidden_act": expected}


def hunyuan_fields(cfg: dict[str, Any], rope_theta: float, num_layers: int) -> dict[str, Any]:
    """HunYuan's: its "dynamic" rope with a fixed `alpha` is plain RoPE on the base
    theta * alpha ** (d / (d - 2)) (transformers' ntk_alpha); the MoE's experts; cross-layer
    attention refused."""
    if cfg.get("use_cla"):
        raise ValueError("config.json: use_cla (cross-layer attention) is not supported")
    moe = {}
    if cfg.get("model_type") == "hunyuan_v1_moe":
        moe = {"moe": hunyuan_moe_fields(cfg, num_layers)}
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    alpha = scaling.get("alpha")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "dynamic" or not alpha:
        return moe
    num_heads = int(cfg["num_attention_heads"])
    dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // num_heads)
    return moe | {"rope_theta": rope_theta * float(alpha) ** (dim / (dim - 2))}


def ministral3_fields(rope: dict[str, Any] | None) -> dict[str, Any]:
    """Ministral 3's query scale (its rope parameters' `llama_4_scaling_beta`, over the yarn
    scaling's original_max_position_embeddings): ModelConfig.query_scale, or none."""
    beta = (rope or {}).get("llama_4_scaling_beta")
    if not beta:
        return {}
    length = (rope or {}).get("original_max_position_embeddings")
    if not isinstance(length, int) or length <= 0:
        raise ValueError(
            "config.json: llama_4_scaling_beta needs rope_parameters' "
            "original_max_position_embeddings (a positive integer)"
        )
    return {"query_scale": (float(beta), length)}


def minimax_m2_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """MiniMax-M2's experts, and the rotary dims its config.json names (`rotary_dim`;
    transformers 5 writes partial_rotary_factor too); q / k norms other than transformers'
    (whole width, always on) refused by name."""
    if not cfg.get("use_qk_norm", True) or cfg.get("qk_norm_type", "per_layer") != "per_layer":
        raise ValueError(
            "config.json: minimax_m2 runs with use_qk_norm and qk_norm_type 'per_layer' (q / k "
            "normalised across all heads) only"
        )
    fields: dict[str, Any] = {"moe": minimax_m2_moe_fields(cfg, num_layers)}
    rotary = cfg.get("rotary_dim")
    if rotary:
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
        fields |= partial_rotary_fields(int(rotary) / head_dim, head_dim, "minimax_m2")
    return fields
