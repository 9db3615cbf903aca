"""Which module runs each layer of a model: the plain pre-norm layer (gpu/models.py) or a
family's own, each a DecoderLayer subclass in a module of its own, imported when a model needs
it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from troupe.gpu.hf_families import COHERE_TYPES
from troupe.gpu.model_config import ModelConfig

if TYPE_CHECKING:
    from troupe.gpu.models import DecoderLayer


def layer_class(config: ModelConfig, layer: int) -> type[DecoderLayer]:
    """The module of one layer: the Gemmas', DeepSeek's MLA layer (gpu/mla_layer.py), OLMo 2's
    and OLMoE's (gpu/olmo2_layer.py), Cohere's (gpu/cohere_layer.py), StarCoder2's and
    Nemotron's, Arcee's, Apertus's, HunYuan's (dense and MoE), MiniMax-M2's, an MoE layer (gpu/moe_layer.py) or the plain one."""
    if config.mla is not None:
        from troupe.gpu.mla_layer import MlaLayer

        return MlaLayer
    if config.sandwich_norms:
        from troupe.gpu.gemma3_layer import Gemma3Layer  # they subclass DecoderLayer

        return Gemma3Layer
    if config.model_type in ("olmo2", "olmo3", "exaone4"):
        from troupe.gpu.olmo2_layer import Olmo2Layer

        return Olmo2Layer
    if config.model_type == "olmoe":
        from troupe.gpu.olmo2_layer import OlmoeLayer  # MoeLayer under OLMo's q / k norms

        return OlmoeLayer
    if config.model_type == "gpt_oss":
        from troupe.gpu.gpt_oss_layer import GptOssLayer

        return GptOssLayer
    if config.model_type in COHERE_TYPES:
        from troupe.gpu.cohere_layer import CohereLayer

        return CohereLayer
    if config.model_type == "hunyuan_v1_dense":
        from troupe.gpu.hunyuan_layer import HunyuanLayer

        return HunyuanLayer
    if config.model_type == "hunyuan_v1_moe":
        from troupe.gpu.hunyuan_layer import HunyuanMoeLayer

        return HunyuanMoeLayer
    if config.model_type == "starcoder2":
        from troupe.gpu.starcoder2_layer import Starcoder2Layer

        return Starcoder2Layer
    if config.model_type == "nemotron":
        from troupe.gpu.starcoder2_layer import NemotronLayer

        return NemotronLayer
    if config.model_type == "apertus":
        from troupe.gpu.apertus_layer import ApertusLayer

        return ApertusLayer
    if config.model_type == "arcee":
        from troupe.gpu.starcoder2_layer import UngatedMlpLayer  # Llama's, Nemotron's MLP

        return UngatedMlpLayer
    if config.model_type == "minimax_m2":
        from troupe.gpu.minimax_m2_layer import MiniMaxM2Layer

        return MiniMaxM2Layer
    if config.model_type == "glm4":
        from troupe.gpu.glm4_layer import Glm4Layer

        return Glm4Layer
    if config.is_sparse(layer) and config.moe is not None and config.moe.routing is not None:
        from troupe.gpu.grouped_moe_layer import GroupedMoeLayer  # GLM-4.5's, dots.llm1's

        return GroupedMoeLayer
    if config.is_sparse(layer):
        from troupe.gpu.moe_layer import MoeLayer

        return MoeLayer
    from troupe.gpu.models import DecoderLayer

    return DecoderLayer
