"""PPStageModel: one pipeline stage's part of a DecoderModel, and its links to the others.

    stage 0      ids ─► embed ─► its layers ─► send [hidden | residual] ─► stage 1
    stage s      recv ─► its layers ─► send ─► stage s+1
    last stage   recv ─► its layers ─► norm ─► lm_head ─► logits ═ broadcast ═► every stage

Every stage runs the whole ModelRunner step on the same plan (gpu/pp_worker.py): each stage's
forward returns rows of the shape the last stage's has (zeros on the others), and
compute_logits broadcasts the last stage's logits, so every stage samples the same tokens
(greedy; seeded noise keyed by seed and position) and keeps the same per-request state, as
tensor-parallel ranks do; the last stage answers. Stages that do not hold the embedding, the
norm or the lm_head keep them as empty parameters (gpu/pp_weights.py fills those empty).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.models import DecoderModel, KVCache, new_param
from troupe.gpu.pp_stage import PPStage
from troupe.gpu.tp_group import TPGroup
from troupe.kernels.ops import KernelBackend


class PPStageModel(DecoderModel):
    """A DecoderModel over one stage's layers that passes its residual stream on."""

    def __init__(
        self,
        stage: PPStage,
        full: ModelConfig,
        group: TPGroup,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int,
        kernel_backend: KernelBackend = "auto",
    ) -> None:
        if full.text_of is not None:  # the stage reader renumbers the checkpoint's own names
            raise ModelLoadError(
                f"the text model of a {full.text_of} checkpoint: pipeline parallelism is not "
                "supported; run one stage"
            )
        if full.model_type == "exaone":  # ... and asks for Llama's names, not EXAONE's
            raise ModelLoadError("exaone: pipeline parallelism is not supported; run one stage")
        super().__init__(stage.layer_config(full), dtype, device, max_positions, kernel_backend)
        self.stage = stage
        self.group = group
        hidden = full.hidden_size
        if not stage.holds_embedding:
            self.embed_tokens = new_param(0, hidden, dtype=dtype, device=device)
        if not stage.is_last:
            self.norm = new_param(0, dtype=dtype, device=device)
            if self.norm_bias is not None:
                self.norm_bias = new_param(0, dtype=dtype, device=device)
            if self.lm_head is not None:
                self.lm_head = new_param(0, hidden, dtype=dtype, device=device)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        input_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The last stage: normed hidden states of meta.logits_indices' rows, as
        DecoderModel.forward. Other stages: zeros of that shape, after sending theirs on."""
        stage, c = self.stage, self.config
        num_tokens = len(input_ids)
        residual: torch.Tensor | None = None
        if stage.is_first:
            hidden = self.input_hidden(input_ids, input_rows)
        else:  # [hidden | residual] of the stage before: one message, not two
            pair = torch.empty(2, num_tokens, c.hidden_size, dtype=self.dtype, device=self.device)
            self.group.recv(pair, stage.index - 1)
            hidden, residual = pair[0], pair[1]
        for layer, kv_cache, table in zip(self.layers, kv_caches, self._rope_tables, strict=True):
            cos_sin = self.get_buffer(table)
            hidden, residual = layer(hidden, residual, positions, meta, kv_cache, cos_sin, self.ops)
        assert residual is not None
        idx = meta.logits_indices
        if not stage.is_last:
            self.group.send(torch.stack([hidden, residual]), stage.index + 1)
            return hidden.new_zeros(idx.numel(), c.hidden_size)
        if idx.numel() == 0:  # only mid-prompt chunks: no kernel launch on an empty grid
            return hidden[:0]
        normed = self.final_norm(hidden[idx], self.norm, c.rms_norm_eps, residual[idx])
        out: torch.Tensor = normed[0]
        return out

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last stage's logits of these rows, on every stage (a broadcast)."""
        if self.stage.is_last:
            logits = super().compute_logits(hidden).contiguous()
        else:
            shape = (hidden.shape[0], self.config.vocab_size)
            logits = torch.empty(shape, dtype=self.logits_dtype, device=self.device)
        if logits.numel():  # every stage computes the same row counts from the same plan
            self.group.broadcast(logits, self.stage.size - 1)
        return logits
