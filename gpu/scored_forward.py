"""The runner's forward for plans that score prompt rows (SamplingParams.prompt_logprobs).

A step without scored rows goes to the ForwardPass as it is (graphs and all). One with them runs
eagerly (ForwardPass.scored) and its rows' logprobs are kept here until the executor takes them
with the step's tokens (Runner.take_prompt_logprobs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.prompt_logprobs import score_prompt_rows
from troupe.gpu.step_inputs import StepInputs
from troupe.messages import PromptLogprobs


class ScoredForward:
    """Logits of a step's sampled rows, as ForwardPass gives them; scored prompt rows kept."""

    def __init__(
        self, forward: ForwardPass, compute_logits: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        self.forward = forward
        self.compute_logits = compute_logits
        self._scores: list[PromptLogprobs] = []  # scored chunks not yet taken

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        if inputs.prompt_rows is None:
            return self.forward(inputs)
        logits, hidden = self.forward.scored(inputs)
        self._scores += score_prompt_rows(hidden, inputs.prompt_rows, self.compute_logits)
        return logits

    def take(self) -> tuple[PromptLogprobs, ...]:
        """The chunks scored since the last call."""
        scores, self._scores = tuple(self._scores), []
        return scores
