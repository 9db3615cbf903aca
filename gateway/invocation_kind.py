"""Which endpoint a SageMaker /invocations body names, by the fields it has, in vLLM's order
(the first request shape the body fits). The server runs the body as that endpoint
(gateway/sagemaker_routes.py); the router keys it as that endpoint's body
(gateway/router_keys.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

# chat completions, completions, an `input` endpoint (embeddings, classify or pooling, as the
# model serves), score, rerank
InvocationKind = Literal["chat", "completion", "input", "score", "rerank"]

NAMES_NONE = (
    "/invocations runs a body as the endpoint its fields name, and this one names none: send "
    "messages (chat), prompt or prompt_embeds (completions), input (embeddings, classify or "
    "pooling), text_1 and text_2 (score), or query and documents (rerank)"
)


def invocation_kind(has: Callable[[str], bool]) -> InvocationKind | None:
    """The endpoint a body names (`has(field)`: whether it sends that field, not as null)."""
    if has("messages"):
        return "chat"
    if has("prompt") or has("prompt_embeds"):
        return "completion"
    if has("input"):
        return "input"
    if has("text_1") and has("text_2"):
        return "score"
    if has("query") and has("documents"):
        return "rerank"
    return None
