"""Which requests a model serves (vLLM's supported pooling tasks):

    model                                   serves
    causal LM                               generation, embed, token_embed
    *ForSequenceClassification              classify, token_classify
    *ForTokenClassification                 token_classify

vLLM's pooling runner refuses generation the same way; a classifier's one drawn token (through
its embeddings, it has no lm_head) is no text, so a completion, a chat or an embedding of it
is refused at admission, naming `model`, rather than answered with noise; a classify task the
model's head does not serve names `pooling`. Classify tasks generate exactly one token.
"""

from __future__ import annotations

from troupe.messages.sampling import SamplingParams


def task_problem(
    params: SamplingParams, num_labels: int, is_token_classifier: bool = False
) -> tuple[str, str] | None:
    """(field, message) when a request does not fit the model's task; None when it does.
    `num_labels`: the model's labels (0: a causal LM); `is_token_classifier`: a
    *ForTokenClassification model's labels."""
    pooling = params.pooling
    task = None if pooling is None else pooling.task
    is_classify = pooling is not None and pooling.is_classify
    if num_labels and not is_classify:
        kind, served = _kind(is_token_classifier)
        return "model", (
            f"the model is a {kind} model ({num_labels} labels): it serves {served} requests "
            "only, not generation or embeddings"
        )
    if num_labels and is_token_classifier and task == "classify":
        return "pooling", (
            "pooling.task 'classify' needs a sequence-classification model: the model is a "
            "token-classification model (a *ForTokenClassification checkpoint), it serves "
            "token_classify"
        )
    if not num_labels and is_classify:
        return "pooling", (
            f"pooling.task {task!r} needs a classification model "
            "(a *ForSequenceClassification or *ForTokenClassification checkpoint)"
        )
    if is_classify and params.max_tokens != 1:
        return (
            "max_tokens",
            f"a {task} request generates 1 token, got max_tokens={params.max_tokens}",
        )
    return None


def _kind(is_token_classifier: bool) -> tuple[str, str]:
    if is_token_classifier:
        return "token-classification", "token_classify (POST /pooling)"
    return "sequence-classification", "classify (POST /classify) and token_classify (POST /pooling)"
