"""Which module runs each layer of a model: the plain pre-norm layer (gpu/models.py) or a
family's own, each a DecoderLayer subclass in a module of its own, imported when a model needs
it."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from troupe.gpu.hf_families import COHERE_TYPES
from troupe.gpu.model_config import ModelConfig

if TYPE_CHECKING:
    from troupe.gpu.models import DecoderLayer


# model_type -> (module under troupe.gpu, class): the families whose every layer is their own
_FAMILY_LAYERS: dict[str, tuple[str, str]] = {
    "olmo2": ("olmo2_layer", "Olmo2Layer"),
    "olmo3": ("olmo2_layer", "Olmo2Layer"),
    "exaone4": ("olmo2_layer", "Olmo2Layer"),
    "olmoe": ("olmo2_layer", "OlmoeLayer"),  # MoeLayer under OLMo's q / k norms
    "gpt_oss": ("gpt_oss_layer", "GptOssLayer"),
    **{model_type: ("cohere_layer", "CohereLayer") for model_type in COHERE_TYPES},
    "hunyuan_v1_dense": ("hunyuan_layer", "HunyuanLayer"),
    "hunyuan_v1_moe": ("hunyuan_layer", "HunyuanMoeLayer"),
    "starcoder2": ("starcoder2_layer", "Starcoder2Layer"),
    "nemotron": ("starcoder2_layer", "NemotronLayer"),
    "apertus": ("apertus_layer", "ApertusLayer"),
    "arcee": ("starcoder2_layer", "UngatedMlpLayer"),  # Llama's, Nemotron's MLP
    "minimax_m2": ("minimax_m2_layer", "MiniMaxM2Layer"),
    "glm4": ("glm4_layer", "Glm4Layer"),
}


def layer_class(config: ModelConfig, layer: int) -> type[DecoderLayer]:
    """The module of one layer: the Gemmas', DeepSeek's MLA layer (gpu/mla_layer.py), a
    family's own (_FAMILY_LAYERS: OLMo 2's, Cohere's, StarCoder2's, HunYuan's, MiniMax-M2's,
    ...), an MoE layer (gpu/moe_layer.py, gpu/grouped_moe_layer.py) or the plain one."""
    if config.mla is not None:
        from troupe.gpu.mla_layer import MlaLayer

        return MlaLayer
    if config.sandwich_norms:
        from troupe.gpu.gemma3_layer import Gemma3Layer  # they subclass DecoderLayer

        return Gemma3Layer
    family = _FAMILY_LAYERS.get(config.model_type)
    if family is not None:
        module, name = family
        found: type[DecoderLayer] = getattr(import_module(f"troupe.gpu.{module}"), name)
        return found
    if config.is_sparse(layer) and config.moe is not None and config.moe.routing is not None:
        from troupe.gpu.grouped_moe_layer import GroupedMoeLayer  # GLM-4.5's, dots.llm1's

        return GroupedMoeLayer
    if config.is_sparse(layer):
        from troupe.gpu.moe_layer import MoeLayer

        return MoeLayer
    from troupe.gpu.models import DecoderLayer

    return DecoderLayer
