"""The runner's forward for plans that read final hidden states (StepPlan.reads_hidden).

A step without such rows goes to the ForwardPass as it is (graphs and all). One with them runs
eagerly (ForwardPass.scored): scored prompt rows become logprobs (gpu/prompt_logprobs.py),
pooled rows are summed per request until its prompt's last position is in, then turned into
its embedding (gpu/hidden_rows.py), or, for a classify request, into the score head's logits
or probabilities (gpu/classifier_config.py); per-token tasks keep every row's output
(gpu/token_rows.py). What they give is kept here until the executor takes it
with the step's tokens (Runner.take_hidden_outputs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from troupe.gpu.classifier_config import Activation
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.hidden_rows import PooledRows
from troupe.gpu.models import DecoderModel
from troupe.gpu.prompt_logprobs import score_prompt_rows
from troupe.gpu.runner import HiddenOutputs
from troupe.gpu.step_inputs import StepInputs
from troupe.gpu.token_rows import TokenRows
from troupe.messages import PromptLogprobs
from troupe.messages.pooling import Pooled


class Classifier:
    """A classification model's score head over fp32 rows [..., hidden] (a token
    classifier's with its bias)."""

    def __init__(
        self,
        weight: torch.Tensor,
        activation: Activation,
        bias: torch.Tensor | None = None,
        token_activation: Activation = "softmax",
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.activation = activation  # classify's
        self.token_activation = token_activation  # token_classify's

    @classmethod
    def of(cls, model: DecoderModel) -> Classifier | None:
        """The model's head (None: not a classification model)."""
        c = model.config.classifier
        if model.score is None or c is None:
            return None
        return cls(model.score, c.activation, model.score_bias, c.token_activation)

    def __call__(self, pooled: torch.Tensor, use_activation: bool) -> torch.Tensor:
        """Logits [num_labels] (fp32), activated when `use_activation`."""
        return _activated(self.logits(pooled), self.activation if use_activation else "none")

    def rows(self, hidden: torch.Tensor, use_activation: bool) -> torch.Tensor:
        """Each row's logits [R, num_labels], with token_classify's activation when asked."""
        return _activated(self.logits(hidden), self.token_activation if use_activation else "none")

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden.float() @ self.weight.float().t()
        return logits if self.bias is None else logits + self.bias.float()


def _activated(logits: torch.Tensor, activation: Activation) -> torch.Tensor:
    if activation == "none":
        return logits
    if activation == "sigmoid":
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


class ScoredForward:
    """Logits of a step's sampled rows, as ForwardPass gives them; hidden outputs kept."""

    def __init__(
        self,
        forward: ForwardPass,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        classifier: Classifier | None = None,
    ) -> None:
        self.forward = forward
        self.compute_logits = compute_logits
        self.classifier = classifier  # a classification model's score head
        self._scores: list[PromptLogprobs] = []  # scored chunks not yet taken
        self._pooled: list[Pooled] = []  # embeddings not yet taken
        self._sums: dict[str, tuple[torch.Tensor, int]] = {}  # mean pooling under way
        self._token_rows = TokenRows(None if classifier is None else classifier.rows)

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        extra = inputs.hidden_rows
        if extra is None:
            return self.forward(inputs)
        logits, hidden = self.forward.scored(inputs)
        num_scored = extra.num_scored
        if extra.scored is not None:
            self._scores += score_prompt_rows(
                hidden[:num_scored], extra.scored, self.compute_logits
            )
        if extra.pooled is not None:
            self._pool(hidden[num_scored:], extra.pooled)
        return logits

    def _pool(self, hidden: torch.Tensor, pooled: PooledRows) -> None:
        row = 0
        for seq in pooled.seqs:
            rows = hidden[row : row + seq.num_rows]
            row += seq.num_rows
            if seq.is_per_token:
                if (whole := self._token_rows.add(seq, rows)) is not None:
                    self._pooled.append(whole)
                continue
            part = rows.float().sum(dim=0)
            total, count = self._sums.pop(seq.request_id, (None, 0))
            if total is None or seq.first:  # a prompt computed again starts over
                total, count = part, seq.num_rows
            else:
                total, count = total + part, count + seq.num_rows
            if not seq.done:
                self._sums[seq.request_id] = (total, count)
                continue
            vector = total / count
            if seq.task == "classify":
                assert self.classifier is not None, "admission lets classify in on classifiers"
                vector = self.classifier(vector, seq.normalize)
            elif seq.normalize:
                vector = torch.nn.functional.normalize(vector, dim=0)
            self._pooled.append(Pooled(seq.request_id, tuple(vector.tolist())))

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the sums of requests released before their prompts were whole."""
        if not self._sums and not self._token_rows:  # every step calls this: the common case
            return
        request_ids = tuple(request_ids)
        self._token_rows.forget(request_ids)
        for request_id in request_ids:
            self._sums.pop(request_id, None)

    def take(self) -> HiddenOutputs:
        """What the steps since the last call gave."""
        out = HiddenOutputs(prompt_logprobs=tuple(self._scores), embeddings=tuple(self._pooled))
        self._scores, self._pooled = [], []
        return out
