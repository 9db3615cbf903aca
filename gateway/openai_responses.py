"""OpenAI response objects and stream chunks, built from engine events."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from troupe.gateway.completion_logprobs import (
    LOGPROB_FLOOR,
    LogprobRow,
    TokenTexts,
    logprobs_object,
    rows,
)
from troupe.gateway.engine_api import TokenizerLike
from troupe.messages import Aborted, Delta, Failed, Finished, StreamEvent, TokenLogprob, Usage


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


class ResponseBuilder:
    """Shapes one request's answer: a full object, or chunks for SSE."""

    def __init__(
        self,
        kind: str,
        model: str,
        response_id: str,
        tokenizer: TokenizerLike | None,
        *,
        continuous_usage: bool = False,
        tokens_as_ids: bool = False,
    ) -> None:
        self.kind = kind
        self.model = model
        self.id = response_id
        self.created = int(time.time())
        # one token's text: generated tokens as before (special tokens skipped); the prompt's
        # with special tokens kept, as an echoed prompt's text keeps them; logprobs name them
        # "token_id:{id}" with tokens_as_ids (vLLM's return_tokens_as_token_ids)
        self.token_text = TokenTexts(
            tokenizer, skip_special_tokens=True, as_token_ids=tokens_as_ids
        )
        self.prompt_token_text = TokenTexts(
            tokenizer, skip_special_tokens=False, as_token_ids=tokens_as_ids
        )
        # completions logprobs: where each token starts in its choice's text, per choice
        self._text_offsets: dict[int, int] = {}
        # stream_options.continuous_usage_stats: every chunk carries the counts so far
        self._continuous_usage = continuous_usage
        self._num_prompt_tokens = 0
        self._completion_tokens: dict[int, int] = {}  # per sample (choice index)

    @property
    def continuous_usage(self) -> bool:
        """stream_options.continuous_usage_stats: every chunk carries the counts so far."""
        return self._continuous_usage

    def see_prompt(self, event: StreamEvent) -> None:
        """Learn the prompt's length from an event that tells it (chunks before its own)."""
        if isinstance(event, Delta) and event.prompt_tokens is not None:
            self._num_prompt_tokens = event.prompt_tokens
        elif isinstance(event, Finished):
            self._num_prompt_tokens = event.usage.prompt_tokens

    def count(self, event: StreamEvent) -> None:
        """Continuous usage: fold in an event before its chunks are built."""
        if not self._continuous_usage:
            return  # the counts are read only for continuous usage
        self.see_prompt(event)
        if isinstance(event, Finished):
            self._completion_tokens[event.index] = event.usage.completion_tokens
        elif isinstance(event, (Delta, Aborted, Failed)):
            done = self._completion_tokens.get(event.index, 0)
            self._completion_tokens[event.index] = done + len(event.token_ids)

    @property
    def _num_completion_tokens(self) -> int:
        return sum(self._completion_tokens.values())

    # -- logprobs ------------------------------------------------------------------------------

    def logprobs_json(
        self,
        logprobs: Sequence[TokenLogprob] | None,
        index: int = 0,
        lead: Sequence[LogprobRow] = (),
    ) -> dict[str, Any] | None:
        """Completions: tokens/token_logprobs/top_logprobs/text_offset, `lead`'s rows (echo:
        the prompt's) first. Chat: content list (`bytes`: the token's text's, whatever name
        `token` gives it)."""
        if logprobs is None and not lead:
            return None
        text = self.token_text
        if self.kind == "chat":
            content = []
            for lp in logprobs or ():
                content.append(
                    {
                        "token": text.label(lp.token_id),
                        "logprob": max(lp.logprob, LOGPROB_FLOOR),  # no -inf in JSON
                        "bytes": list(text(lp.token_id).encode()),
                        "top_logprobs": [
                            {
                                "token": text.label(tid),
                                "logprob": max(value, LOGPROB_FLOOR),
                                "bytes": list(text(tid).encode()),
                            }
                            for tid, value in lp.top
                        ],
                    }
                )
            return {"content": content}
        all_rows = [*lead, *rows(logprobs or (), None, text)]
        body, self._text_offsets[index] = logprobs_object(
            all_rows, self._text_offsets.get(index, 0)
        )
        return body

    # -- whole response ------------------------------------------------------------------------

    def full(
        self,
        text: str,
        finish_reason: str,
        usage: Usage,
        logprobs: Sequence[TokenLogprob] | None,
        stop_reason: str | int | None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A response of one choice; see `choice` and `full_choices`."""
        choice = self.choice(0, text, finish_reason, logprobs, stop_reason, tool_calls)
        return self.full_choices([choice], usage)

    def choice(
        self,
        index: int,
        text: str,
        finish_reason: str,
        logprobs: Sequence[TokenLogprob] | None,
        stop_reason: str | int | None,
        tool_calls: list[dict[str, Any]] | None = None,
        content: str | None = None,
        lead: Sequence[LogprobRow] = (),
    ) -> dict[str, Any]:
        """One choice; `tool_calls`: the answer is these calls (finish "tool_calls"), with
        `content` beside them (tool_choice "auto": the text around them; else null); `lead`:
        logprob rows ahead of the generated tokens' (echo: the prompt's)."""
        logprobs_json = self.logprobs_json(logprobs, index, lead)
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs_json}
        if tool_calls is not None:
            choice["message"] = {"role": "assistant", "content": content, "tool_calls": tool_calls}
            finish_reason = "tool_calls"
        elif self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = stop_reason  # vLLM's extra: the stop string or token id hit
        return choice

    def full_choices(self, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
        """The whole response: its choices (n of them with parallel sampling) and usage."""
        return {
            "id": self.id,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_json(usage),
        }

    # -- stream chunks -------------------------------------------------------------------------

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        usage_dict = usage_json(usage) if usage is not None else None
        if usage_dict is None and self._continuous_usage:
            usage_dict = {  # vLLM's shape: no details mid-stream
                "prompt_tokens": self._num_prompt_tokens,
                "completion_tokens": self._num_completion_tokens,
                "total_tokens": self._num_prompt_tokens + self._num_completion_tokens,
            }
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_dict,
        }

    def role_chunk(self, index: int = 0) -> dict[str, Any]:
        """Chat streams open with the assistant role, per choice (OpenAI does the same)."""
        return self._chunk(
            [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )

    def delta_chunk(
        self,
        text: str,
        logprobs: Sequence[TokenLogprob] | None,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
        index: int = 0,
        lead: Sequence[LogprobRow] = (),
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.kind == "chat":
            choice["delta"] = {"content": text} if text or finish_reason is None else {}
        else:
            choice["text"] = text
        choice["logprobs"] = self.logprobs_json(logprobs, index, lead)
        choice["finish_reason"] = finish_reason
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        return self._chunk([choice])

    def reasoning_chunk(self, text: str, index: int = 0) -> dict[str, Any]:
        """Chat with a reasoning parser: a delta of the answer's thinking."""
        delta = {"reasoning_content": text}
        return self._chunk(
            [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]
        )

    def tool_call_chunk(
        self, tool_calls: list[dict[str, Any]], finish_reason: str | None = None
    ) -> dict[str, Any]:
        """Chat: a delta carrying tool_calls (streamed pieces, as OpenAI's)."""
        delta = {"tool_calls": tool_calls} if tool_calls else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._chunk([choice])

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """stream_options.include_usage: one last chunk with no choices and the usage."""
        return self._chunk([], usage)
