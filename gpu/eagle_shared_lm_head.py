"""An EAGLE-3 head shipped without lm_head.weight: its logits are the model's own, as vLLM's
proposer shares the target's lm_head with a head that loaded none.

That is only possible where the head's rows are the model's: its draft vocabulary is the
model's vocabulary (d2t, if shipped, the identity) and its width the model's hidden size;
gpu/eagle3_load.py checks both (ConfigErrors naming both sizes) before building one.
"""

from __future__ import annotations

import torch
from troupe.gpu.eagle3_model import Eagle3Head
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel


class Eagle3SharedHead(Eagle3Head):
    """An EAGLE-3 head whose logits come from the model's lm_head (its tied embedding, if the
    model ties them), in the model's logits dtype; everything else as Eagle3Head."""

    def __init__(
        self,
        config: ModelConfig,
        target: DecoderModel,
        *,
        max_positions: int,
        num_taps: int,
        norm_before_residual: bool = False,
        own_embedding: bool = False,
    ) -> None:
        super().__init__(
            config,
            target,
            max_positions=max_positions,
            num_taps=num_taps,
            draft_vocab_size=config.vocab_size,
            target_hidden_size=config.hidden_size,
            norm_before_residual=norm_before_residual,
            own_embedding=own_embedding,
        )
        # no rows of its own (the [V, H] the base allocated goes now, before the pool sizing)
        self.lm_head = self.param(0, config.hidden_size)
        # not a submodule: the model's weights stay the model's (no second copy, no .to())
        self._target_logits = target.compute_logits

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, the model's vocabulary]: the model's lm_head over the head's rows."""
        return self._target_logits(hidden)
