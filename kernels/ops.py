"""The one dispatcher: which implementation of the model's ops runs, chosen once per model.

Two implementations, one signature per op (the KernelOps protocol, which both modules meet):

    kernels/triton_ops.py   the Triton kernels: CUDA (and the CPU under TRITON_INTERPRET=1)
    kernels/reference.py    plain torch in HF's rounding order: the CPU path, and the reference
                            the kernel tests compare the Triton kernels against

KV cache layout, shared with troupe.gpu:

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset_in_block          (int64; < 0 means "skip")
    block_tables: [num_seqs, max_blocks_per_seq] int32      (padding entries never read)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, get_args

if TYPE_CHECKING:  # only annotations here: troupe.config imports this module, keep it light
    import torch

    from .clamped_swiglu import ClampedSwiglu
    from .mxfp4 import Mxfp4Experts

KernelBackend = Literal["auto", "triton", "torch"]


class KernelOps(Protocol):
    """The ops a DecoderModel calls; met by the modules kernels.triton_ops and kernels.reference."""

    # paged_attention reads `new_kv` (so prepare_qkv's keep_k is worth its writes); the
    # reference reads the cache alone
    reads_new_kv: bool

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        *,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> None:
        """In place: key/value [N, Hkv, D] into the caches at slot_mapping [N] int64 (< 0 skips).

        fp8 caches (kernels.kv_quant) take per-head scales [Hkv] fp32: x / scale is stored. The
        attention ops take the same scales and read fp8 caches as float(x) * scale."""
        ...

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        max_query_len: int,
        max_seq_len: int,
        decode_prefix: torch.Tensor | None = None,
        *,
        sliding_window: int = 0,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        seq_order: torch.Tensor | None = None,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
        key_limits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Varlen causal attention for prefill, chunked prefill and decode rows in one call.

        q [T, Hq, D] concatenates each sequence's new tokens (query_start_loc [S+1] int32,
        cumulative). seq_lens [S] int32 counts each sequence's tokens INCLUDING the new ones,
        whose KV is already in the cache. Query i of sequence s sits at position
        seq_lens[s] - q_len_s + i and sees keys at positions <= its own. Hq must be a multiple
        of Hkv. Returns [T, Hq, D] in q's dtype; softmax in fp32. Sequences past the last token
        (q_len 0) and token rows past query_start_loc[S] are padding: nothing is written there.

        decode_prefix (device int32 [1]), a hint: the first N sequences have one token each, so
        an implementation may send them to its decode kernel, starting them in seq_order (a
        hint too: AttentionMetadata.decode_order, those N longest first, then the rest). The
        launch grid depends on shapes only (not on max_query_len or the values), so a CUDA
        graph can capture the call.

        sliding_window > 0: query at position p sees only keys p - sliding_window < k <= p (HF's
        sliding-window mask), and no key before the window of the sequence's first new query is
        read, so the blocks wholly before it may hold anything (freed and reused).

        new_kv, a hint: the new tokens' K and V ([T, Hkv, D] views, row t the token of q's
        row t, exactly what the cache holds, in q's dtype: prepare_qkv's keep_k; an fp8
        cache's units x / scale), which an implementation may read instead of the cache.

        softcap > 0: each score q . k * scale becomes softcap * tanh(score / softcap) before
        the mask (Gemma 2's attention-logit soft-capping, kernels/softcap.py).

        sinks (fp32 [Hq]): each head's learned sink logit joins its softmax as a key of value
        zero (GPT-OSS, kernels/sinks.py).

        key_limits (int32 [T]): row t sees keys at positions <= key_limits[t] instead of its
        own (a Gemma 3 image's rows see their whole image: gpu/embed_rows.key_limits); every
        such key is in the cache. The window still counts back from the row's own position.
        """
        ...

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        max_seq_len: int,
        *,
        sliding_window: int = 0,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        seq_order: torch.Tensor | None = None,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decode: q [S, Hq, D] holds one query per sequence, at position seq_lens[s] - 1.
        With sliding_window > 0 it sees (and reads) only the last sliding_window keys;
        softcap and sinks as in paged_attention.

        seq_order (device int32 [S], a permutation; AttentionMetadata.decode_order), a hint:
        the order in which an implementation should start the sequences' work (longest
        first, kernels/decode_order.py). The result does not depend on it.

        max_seq_len (a host int, an upper bound of seq_lens) picks the number of context splits,
        so a CUDA graph captured with a fixed max_seq_len replays one fixed launch.
        """
        ...

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm over the last dim, x's dtype out.

        Without residual: (rmsnorm(x) * weight, x). With it: h = x + residual, returns
        (rmsnorm(h) * weight, h): the fused add + norm of a pre-norm transformer block.
        """
        ...

    def rotary(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Neox-style rotary on q [T, Hq, D] and k [T, Hkv, D] at positions [T] int64.

        Use the returned tensors: the Triton kernel rotates in place, the reference does not.
        """
        ...

    def update_kv_scales(
        self,
        qkv: torch.Tensor,
        k_norm_weight: torch.Tensor | None,
        eps: float,
        num_kv_heads: int,
        head_dim: int,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
    ) -> None:
        """fp8 caches: in place, the unset (0) per-head scales [Hkv] from this batch's k and v
        (qkv [T, W]); set scales never change (kernels.kv_quant.update_kv_scales)."""
        ...

    def prepare_qkv(
        self,
        qkv: torch.Tensor,
        q_norm_weight: torch.Tensor | None,
        k_norm_weight: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        *,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        keep_k: bool = False,
    ) -> torch.Tensor:
        """The attention prologue on the fused projection output qkv [T, (Hq + 2*Hkv) * D].

        Per head RMSNorm of q and k over D (Qwen3; only when both weights are given), neox
        rotary at positions [T], k and v written to the caches at slot_mapping [T] (< 0 skips).
        Hkv and D come from the cache shape. Returns q [T, Hq, D], new and contiguous.
        keep_k: the normed, rotated k also replaces qkv's k columns, so qkv's k and v columns
        hold what the cache got (paged_attention's new_kv; an fp8 cache's units in both).
        """
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU: silu(gate) * up for gate_up [T, 2I] = [gate | up]; returns [T, I]."""
        ...

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """GeGLU (Gemma): gelu_tanh(gate) * up for gate_up [T, 2I] = [gate | up]; returns [T, I]."""
        ...

    def fused_moe(
        self,
        x: torch.Tensor,
        w13: torch.Tensor | Mxfp4Experts,
        w2: torch.Tensor | Mxfp4Experts,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        *,
        b13: torch.Tensor | None = None,
        b2: torch.Tensor | None = None,
        clamped: ClampedSwiglu | None = None,
    ) -> torch.Tensor:
        """Mixture of SwiGLU experts: x [T, H], w13 [E, 2I, H] (gate | up), w2 [E, H, I],
        each token's experts topk_ids [T, k] and weights topk_weights [T, k] (x's dtype).
        Returns sum_k weight * expert(x) [T, H] (kernels/moe_reference.py states it exactly).

        GPT-OSS's experts: biases b13 [E, 2I] (gate | up, added before the activation) and
        b2 [E, H] (added to each expert's output before its weight), and `clamped` in place
        of silu(gate) * up (kernels/clamped_swiglu.py). w13 and w2 may be MXFP4
        (kernels/mxfp4.py: GPT-OSS's files kept packed)."""
        ...

    def write_latent(
        self,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """MLA: in place, [c | k_r] of latent [N, L] and k_rope [N, R] into the latent cache
        [blocks, block_size, L + R] at slot_mapping [N] (< 0 skips)."""
        ...

    def mla_attention(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        cache: torch.Tensor,
        kv_b_proj: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        v_head_dim: int,
        scale: float,
        is_decode: bool,
    ) -> torch.Tensor:
        """MLA attention [T, H, Dv] over the latent cache (kernels/mla_reference.py states it):
        q_nope [T, H, Dn], rotated q_rope [T, H, R], kv_b_proj [H * (Dn + Dv), L]; rows and
        sequences as in paged_attention; is_decode: one row per sequence."""
        ...

    def mla_prefill(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        cache: torch.Tensor,
        kv_b_proj: torch.Tensor,
        blocks: torch.Tensor,
        tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        v_head_dim: int,
        scale: float,
        max_query_len: int,
        max_seq_len: int,
    ) -> torch.Tensor:
        """MLA attention [T, H, Dv] in the expanded form (the latent decompressed to per-head
        K/V, kernels/mla_prefill.py), for prefill chunks; arguments as in mla_attention but
        the blocks: sequence s's j-th cache block is blocks[tables[s, j]] (blocks [NB] int64,
        exactly the blocks to expand). Eager only: its shapes follow the blocks."""
        ...


def select_ops(device: torch.device, backend: KernelBackend = "auto") -> KernelOps:
    """The ops for a model on `device`: "auto" is Triton on CUDA and the reference elsewhere.

    The CPU runs the reference even though Triton's interpreter could run the kernels: the
    interpreter is orders of magnitude slower. backend="triton" runs the kernels on the CPU too
    (the caller must have set TRITON_INTERPRET=1 before Triton was imported); "torch" runs the
    reference on CUDA (debugging: no CUDA graphs then).
    """
    if backend not in get_args(KernelBackend):
        raise ValueError(f"kernel_backend must be auto, triton or torch; got {backend!r}")
    if backend == "triton" or (backend == "auto" and device.type == "cuda"):
        from . import triton_ops

        return triton_ops
    from . import reference

    return reference
