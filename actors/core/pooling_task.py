"""Which requests a model serves: a sequence-classification model (gpu/classifier_config.py)
serves `Pooling(task="classify")` requests only, a causal LM everything but them.

vLLM's pooling runner refuses generation the same way; a classifier's one drawn token (through
its embeddings, it has no lm_head) is no text, so a completion, a chat or an embedding of it
is refused at admission, naming `model`, rather than answered with noise.
"""

from __future__ import annotations

from troupe.messages.sampling import SamplingParams


def task_problem(params: SamplingParams, num_labels: int) -> tuple[str, str] | None:
    """(field, message) when a request does not fit the model's task; None when it does.
    `num_labels`: the model's labels (0: a causal LM)."""
    pooling = params.pooling
    is_classify = pooling is not None and pooling.task == "classify"
    if num_labels and not is_classify:
        return "model", (
            f"the model is a sequence-classification model ({num_labels} labels): it serves "
            "classify requests only (POST /classify), not generation or embeddings"
        )
    if not num_labels and is_classify:
        return "pooling", (
            "pooling.task 'classify' needs a sequence-classification model "
            "(a *ForSequenceClassification checkpoint)"
        )
    if is_classify and params.max_tokens != 1:
        return (
            "max_tokens",
            f"a classify request generates 1 token, got max_tokens={params.max_tokens}",
        )
    return None
