"""What proposes tokens inside the executor: a draft model (gpu/draft_runner.py) or an EAGLE
head or DeepSeek MTP layer (gpu/eagle_runner.py), behind one seam the ModelRunner drives after
each step."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from troupe.gpu.draft_model import DraftModel
from troupe.gpu.draft_runner import DraftRunner
from troupe.gpu.eagle_load import EagleModel
from troupe.gpu.eagle_runner import EagleRunner
from troupe.gpu.request_states import RequestState
from troupe.gpu.runner_setup import RunnerOptions
from troupe.gpu.sleep_parts import Companion
from troupe.messages import SampledToken, SeqWork, StepPlan

Drafter = DraftModel | EagleModel  # what runner_setup loads for speculative_method


class Proposer(Companion, Protocol):
    """Proposals after each step, on the step's SampledTokens; what it owns sleeps with the
    model (gpu/sleep_parts.Companion)."""

    num_rounds: int  # rounds run (RunnerStats.num_draft_rounds)
    num_proposed: int  # tokens proposed (RunnerStats.num_draft_tokens)

    def prepare(self, plan: StepPlan) -> None:
        """The plan's releases and swaps (its pool moves with the target's)."""

    def propose(
        self,
        seqs: tuple[SeqWork, ...],
        states: list[RequestState],
        tables: np.ndarray,
        sampled: tuple[SampledToken, ...],
    ) -> tuple[SampledToken, ...]:
        """`sampled` with proposals attached (the same tokens, plan order)."""

    def close(self) -> None: ...


def build_proposer(draft: Drafter, options: RunnerOptions) -> Proposer:
    """The runner of what was loaded."""
    if isinstance(draft, EagleModel):
        return EagleRunner.for_options(draft, options)
    return DraftRunner.for_options(draft, options)
