"""The decoder, Megatron-style sharded over tensor-parallel ranks.

Each rank holds (H heads, Hkv KV heads, I intermediate, V vocab, P = tensor_parallel_size):

    qkv_proj      column-parallel: H/P query heads, and max(1, Hkv/P) KV heads (when Hkv < P
                  each KV head is replicated on the P/Hkv ranks whose query heads use it)
    o_proj        row-parallel: the rank's H/P heads' columns; partial sums all-reduced
    gate_up_proj  column-parallel: I/P rows of gate and of up
    down_proj     row-parallel: I/P columns; partial sums all-reduced
    embed_tokens  vocab-parallel: rows [r*ceil(V/P), (r+1)*ceil(V/P)); a rank embeds the ids
                  it owns, zeros the others, and the all-reduce adds the one non-zero row
    lm_head       vocab-parallel like the embedding (the same shard when tied): each rank's
                  logits columns, all-gathered, so every rank holds the full logits

    experts (MoE)  router whole on every rank; by default each expert's intermediate rows are
                  cut like the dense MLP (gate/up column, down row); with expert_parallel rank
                  r holds experts [r*E/P, (r+1)*E/P) whole (gpu/tp_moe.py). Either way the
                  experts' partial sums are all-reduced like down_proj's
    MLA (DeepSeek) q_proj / q_b_proj and kv_b_proj column-cut by heads, o_proj row-cut; the
                  latent path (q_a_proj, kv_a_proj_with_mqa, their norms) and so the latent
                  KV cache whole on every rank; shared experts cut like the dense MLP
                  (gpu/tp_mla.py)

The layers are DecoderLayer (Gemma 3's sandwich-norm layer, the MoE layer) over a config with
the rank's head and intermediate counts (so the KV pool a runner builds from it holds only the
rank's KV heads); the all-reduces wrap their attention() and mlp(), so Gemma 3's post norms
see the whole sums. Norms, router and rotary tables are whole on every rank.
"""

from __future__ import annotations

import dataclasses

import torch
from troupe.config import ConfigError
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.gemma3_layer import Gemma3Layer
from troupe.gpu.hf_families import HUNYUAN_TYPES
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.models import DecoderLayer, DecoderModel, KVCache
from troupe.gpu.quant_linear import embedding, linear
from troupe.gpu.tp_group import TPGroup
from troupe.kernels.ops import KernelBackend, KernelOps

# where one checkpoint tensor's slice goes on a rank (gpu/tp_weights.py): (destination, dim
# sliced or None for the whole tensor, start, stop)
Target = tuple[torch.Tensor, int | None, int, int]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TPShard:
    """What rank `rank` of `size` holds of a model: ranges in heads, rows and vocab ids."""

    rank: int
    size: int
    full: ModelConfig  # the unsharded model
    expert_parallel: bool = False  # MoE: whole experts per rank, not each expert's rows

    @property
    def num_heads(self) -> int:
        return self.full.num_heads // self.size

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.full.num_kv_heads // self.size)

    @property
    def first_head(self) -> int:
        return self.rank * self.num_heads

    @property
    def first_kv_head(self) -> int:
        """The rank's first KV head: the one its first query head reads."""
        group = self.full.num_heads // self.full.num_kv_heads  # query heads per KV head
        return self.first_head // group

    @property
    def intermediate_size(self) -> int:
        return self.full.intermediate_size // self.size

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.full.vocab_size // self.size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    @property
    def num_vocab_rows(self) -> int:
        """Real rows of the rank's vocab shard (the last one may be short: padded)."""
        return max(0, min(self.vocab_per_rank, self.full.vocab_size - self.vocab_start))

    @property
    def num_local_experts(self) -> int:
        """Experts this rank holds (all of them unless expert_parallel); 0 without experts."""
        total = self.full.moe.num_experts if self.full.moe is not None else 0
        return total // self.size if self.expert_parallel else total

    @property
    def first_expert(self) -> int:
        return self.rank * self.num_local_experts if self.expert_parallel else 0

    @property
    def expert_intermediate_size(self) -> int:
        """Rows of gate (and of up) per expert on this rank: whole under expert_parallel."""
        inter = self.full.moe.intermediate_size if self.full.moe is not None else 0
        return inter if self.expert_parallel else inter // self.size

    @property
    def shared_intermediate_size(self) -> int:
        """Rows of DeepSeek's shared-experts MLP on this rank: always cut, as a dense MLP."""
        moe = self.full.moe
        return moe.num_shared_experts * moe.intermediate_size // self.size if moe else 0

    def layer_config(self) -> ModelConfig:
        """The rank's layers' config: its heads (MLA's too) and intermediate rows (of the dense
        MLP and of each expert it holds), the full vocabulary and latent size."""
        moe, mla = self.full.moe, self.full.mla
        if moe is not None:
            moe = dataclasses.replace(moe, intermediate_size=self.expert_intermediate_size)
        if mla is not None:
            mla = dataclasses.replace(mla, num_heads=self.num_heads)
        return dataclasses.replace(
            self.full,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
            moe=moe,
            mla=mla,
        )


def check_tensor_parallel(config: ModelConfig, size: int, expert_parallel: bool = False) -> None:
    """ConfigError unless `size` ranks can split this model's heads, MLP and experts evenly."""
    if size == 1:
        return
    if config.num_heads % size:
        raise ConfigError(
            f"tensor_parallel_size ({size}) must divide the model's num_attention_heads "
            f"({config.num_heads})"
        )
    hkv = config.num_kv_heads
    if hkv % size and size % hkv:
        raise ConfigError(
            f"tensor_parallel_size ({size}) and the model's num_key_value_heads ({hkv}) must "
            "divide one another (KV heads are split, or replicated when fewer than ranks)"
        )
    has_dense = not all(config.is_sparse(i) for i in range(config.num_layers))
    if has_dense and config.intermediate_size % size:
        raise ConfigError(
            f"tensor_parallel_size ({size}) must divide the model's intermediate_size "
            f"({config.intermediate_size})"
        )
    moe = config.moe
    if moe is not None and expert_parallel and moe.num_experts % size:
        field = "num_experts" if config.mla is None else "n_routed_experts"  # DeepSeek's name
        raise ConfigError(
            f"enable_expert_parallel: tensor_parallel_size ({size}) must divide the model's "
            f"{field} ({moe.num_experts})"
        )
    if moe is not None and not expert_parallel and moe.intermediate_size % size:
        raise ConfigError(
            f"tensor_parallel_size ({size}) must divide the model's moe_intermediate_size "
            f"({moe.intermediate_size}); enable_expert_parallel splits whole experts instead"
        )
    shared = moe.num_shared_experts * moe.intermediate_size if moe is not None else 0
    if shared % size:  # cut like a dense MLP in both modes (vLLM's shared experts)
        raise ConfigError(
            f"tensor_parallel_size ({size}) must divide the shared experts' intermediate size "
            f"(n_shared_experts * moe_intermediate_size = {shared})"
        )


class TPDecoderLayer(DecoderLayer):
    """A DecoderLayer over the rank's shard: o_proj and down_proj outputs are all-reduced."""

    group: TPGroup  # set by TPDecoderModel right after construction

    def attention(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        cos_sin: torch.Tensor,
        ops: KernelOps,
    ) -> torch.Tensor:
        return self.group.all_reduce(super().attention(x, positions, meta, kv_cache, cos_sin, ops))

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        return self.group.all_reduce(super().mlp(x, ops))


class TPGemma3Layer(TPDecoderLayer, Gemma3Layer):
    """Gemma 3's sandwich-norm layer over the rank's shard: attention() and mlp() all-reduce
    (TPDecoderLayer) before Gemma3Layer.forward's post norms read them."""


class TPDecoderModel(DecoderModel):
    """DecoderModel of one rank: sharded layers, vocab-parallel embedding and lm_head."""

    def __init__(
        self,
        shard: TPShard,
        group: TPGroup,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int,
        kernel_backend: KernelBackend = "auto",
    ) -> None:
        layers = shard.layer_config()
        self.shard = shard  # before the layers are built: make_layer reads the expert range
        # built with the vocab shard's rows (embed_tokens, lm_head), then told the full size:
        # callers (the runner, graph buffers) see logits over the whole vocabulary
        local = dataclasses.replace(layers, vocab_size=shard.vocab_per_rank)
        super().__init__(local, dtype, device, max_positions, kernel_backend)
        self.config = layers
        self.group = group
        for layer in self.layers:
            assert isinstance(layer, TPDecoderLayer)
            layer.group = group

    def make_layer(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, index: int
    ) -> DecoderLayer:
        if config.text_of is not None:  # the shard reader reads the checkpoint's own names
            raise ModelLoadError(
                f"the text model of a {config.text_of} checkpoint: tensor parallelism is not "
                "supported; run one rank"
            )
        if config.o_bias or config.mlp_bias:  # a row-parallel bias is added once, not per rank
            raise ModelLoadError(
                "o_proj and MLP biases: tensor parallelism is not supported; run one rank"
            )
        moe = config.moe  # grouped routing, Qwen2-MoE's gated shared expert, GraniteMoE's names
        granite = config.granite is not None
        if (
            config.mla is None
            and moe is not None
            and (moe.routing or moe.gated_shared_size or granite)
        ):
            raise ModelLoadError(
                f"{config.model_type}: tensor parallelism is not supported; run one rank"
            )
        # layers of their own; EXAONE's names, which the shard reader does not rename
        ungated = not config.gated_mlp
        if config.layer_norm or ungated or config.model_type in (*HUNYUAN_TYPES, "exaone"):
            raise ModelLoadError(
                f"{config.model_type}: tensor parallelism is not supported; run one rank"
            )
        if config.head_order is not None:  # the shard reader does not reorder q/k dims
            raise ModelLoadError(
                "partial or interleaved rotary: tensor parallelism is not supported; run one rank"
            )
        if config.sandwich_norms:
            return TPGemma3Layer(config, dtype, device, index)
        if config.model_type in ("olmo2", "olmo3", "exaone4", "olmoe"):  # OLMo-style layers
            raise ModelLoadError(
                f"{config.model_type}: tensor parallelism is not supported; run one rank"
            )
        if config.mla is not None:
            from troupe.gpu.tp_mla import TPMlaLayer  # it subclasses TPDecoderLayer

            return TPMlaLayer(config, dtype, device, index, shard=self.shard)
        if config.is_sparse(index):
            from troupe.gpu.tp_moe import TPMoeLayer  # it subclasses TPDecoderLayer

            return TPMoeLayer(config, dtype, device, index, shard=self.shard)
        return TPDecoderLayer(config, dtype, device, index)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        start, rows = self.shard.vocab_start, self.shard.vocab_per_rank
        local = input_ids - start
        owned = (local >= 0) & (local < rows)
        hidden = embedding(local.clamp(0, rows - 1), self.embed_tokens, self.dtype)
        hidden = hidden.masked_fill(~owned.unsqueeze(1), 0)
        return self.group.all_reduce(hidden)

    @property
    def logits_dtype(self) -> torch.dtype:
        return torch.float32  # the shards' logits are gathered in fp32

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        shard_logits = linear(hidden, weight).float()
        gathered = self.group.all_gather_columns(shard_logits)
        logits = gathered[:, : self.shard.full.vocab_size].contiguous()  # no pad columns
        return self.config.final_logits(logits)
