"""`LLM`: vLLM's offline entry point. One engine kept running between calls (on an event loop
in a thread of its own: anyio's blocking portal), driven by plain synchronous calls.

    with LLM(model="...") as llm:                       # or LLM(EngineConfig(...))
        outputs = llm.generate(["Hello", "The sky is"], SamplingParams(max_tokens=16, n=2))
        outputs[0].outputs[1].text                      # prompt 0's second sample
        llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=32))
        llm.embed(["a text"])[0].embedding              # pooled (SamplingParams.pooling)
        llm.score("a query", ["doc 1", "doc 2"])[1].outputs.score   # a pair's score
        llm.beam_search(["Once"], BeamSearchParams(beam_width=4))[0][0].text   # the best beam

Each prompt is one request; its samples are its `outputs`, by index, as in vLLM's
RequestOutput, and the outputs come back in prompt order whatever order they finish in. A
request the engine turns away raises ValueError naming the prompt and the field (the others
are aborted first); an engine fault raises RuntimeError. An aborted sample ends with
finish_reason "abort". `logprobs` are troupe's TokenLogprob rows (token id, logprob, top).
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import msgspec
from troupe.actors.beam_search import Beam, BeamSearchParams, beam_search
from troupe.actors.daemon_portal import daemon_portal
from troupe.actors.engine import Engine, PromptInput
from troupe.actors.llm_outputs import (
    CompletionOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
    take_event,
)
from troupe.actors.request_input import to_sampling_params
from troupe.actors.score_pairs import Named, cosine_scores, pair_texts, score_kind
from troupe.config import EngineConfig
from troupe.messages import (
    ChatMessage,
    ChatPrompt,
    Failed,
    Pooling,
    PromptEmbeds,
    Rejected,
    SamplingParams,
    StreamEvent,
)
from troupe.messages.profile_calls import ProfileReply


class LLM:
    """An engine for synchronous callers; `close()` (or leaving `with`) stops it."""

    def __init__(
        self, config: EngineConfig | None = None, *, backend: str = "asyncio", **fields: Any
    ) -> None:
        """`config`, with `fields` (EngineConfig's, as vLLM's LLM takes engine arguments:
        `LLM(model="...", max_model_len=4096)`) over it; `backend`: the loop's, asyncio or
        trio."""
        config = config or EngineConfig()
        if fields:
            unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(EngineConfig)})
            if unknown:
                raise TypeError(f"EngineConfig has no field {', '.join(map(repr, unknown))}")
            config = config.replace(**fields)
        exits = contextlib.ExitStack()
        try:
            self._portal = exits.enter_context(daemon_portal(backend))
            opened = self._portal.wrap_async_context_manager(Engine.open(config))
            self.engine: Engine = exits.enter_context(opened)
        except BaseException:
            exits.close()
            raise
        # closed by close(), or when this LLM is collected, or at interpreter exit: its loop's
        # thread is a daemon, so an LLM left open never holds the interpreter there
        self._close = weakref.finalize(self, exits.close)
        self._next_id = 0

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine and its loop (once; later calls do nothing)."""
        self._close()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    def start_profile(self) -> None:
        """vLLM's LLM.start_profile: the torch profiler around the engine's steps (needs
        profiler_dir); a refusal raises RuntimeError with its reason."""
        _profiled(self._portal.call(self.engine.start_profile))

    def stop_profile(self) -> str:
        """Stop it; the path of the trace written into profiler_dir."""
        reply = _profiled(self._portal.call(self.engine.stop_profile))
        assert reply.trace_path is not None
        return reply.trace_path

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams
        | Mapping[str, Any]
        | Sequence[SamplingParams]
        | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt (a text, token ids, a ChatPrompt or PromptEmbeds, or vLLM's prompt
        dicts `{"prompt": text}` / `{"prompt_token_ids": ids}`; one alone or a list of them)
        with its params (one for all, or one each; None: the model's defaults), showing a
        progress bar of finished prompts unless `use_tqdm` is false (vLLM's)."""
        batch = _prompt_list(prompts)
        if isinstance(sampling_params, Sequence):
            if len(sampling_params) != len(batch):
                raise ValueError(
                    f"got {len(sampling_params)} sampling_params for {len(batch)} prompts"
                )
            each = [self._params(p) for p in sampling_params]
        else:
            each = [self._params(sampling_params)] * len(batch)
        return self._portal.call(self._run, batch, each, use_tqdm)

    def chat(
        self,
        messages: Sequence[ChatMessage | Mapping[str, Any]]
        | Sequence[Sequence[ChatMessage | Mapping[str, Any]]],
        sampling_params: SamplingParams
        | Mapping[str, Any]
        | Sequence[SamplingParams]
        | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of messages) or a list of them, rendered
        with the model's chat template (`tools` and `chat_template_kwargs` reach it)."""
        conversations = [messages] if messages and not _is_conversation(messages[0]) else messages
        kwargs = {**(chat_template_kwargs or {}), **({"tools": list(tools)} if tools else {})}
        prompts = [
            ChatPrompt(
                # dicts too: the engine's edge converts them (request_input), naming a bad field
                messages=tuple(conversation),  # type: ignore[arg-type]
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                template_kwargs=kwargs or None,
            )
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        pooling: Pooling | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[PoolingRequestOutput]:
        """vLLM's LLM.embed: each prompt's embedding (`pooling`: how its last hidden states
        pool; default last token, unit norm), in prompt order."""
        return self._pool(prompts, pooling or Pooling(), use_tqdm)

    def classify(
        self, prompts: PromptInput | Sequence[PromptInput], *, use_tqdm: bool = True
    ) -> list[PoolingRequestOutput]:
        """vLLM's LLM.classify (a sequence-classification model): each prompt's class
        probabilities, as `embedding`."""
        return self._pool(prompts, Pooling(task="classify"), use_tqdm)

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
    ) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score: one text of data_1 against each of data_2 (1:1, 1:N), or text i
        against text i (N:N), each pair's score in order: an embedding model's cosine
        similarity, a cross-encoder's (a one-label classifier's) activated logit of the pair
        encoded together (actors/score_pairs.py). ValueError for a model that cannot score or
        sides that do not pair."""
        left, right = _score_side("data_1", data_1), _score_side("data_2", data_2)
        if len(left) not in (1, len(right)):
            raise ValueError(
                f"data_1 has {len(left)} texts and data_2 {len(right)}: score one text against "
                "each (1:N) or as many texts as data_2, pair by pair (N:N)"
            )
        engine = self.engine
        kind = score_kind(engine.model_name, engine.classifier_labels, engine.is_token_classifier)
        pairing = pair_texts(left, right)
        if kind == "cross":
            prompts = pairing.pair_prompts(engine.tokenizer.encode_pair)
            pooled = self._pool(prompts, Pooling(task="classify"), use_tqdm, truncate_prompt_tokens)
            return [
                ScoringRequestOutput(out.request_id, out.prompt_token_ids, out.embedding[0])
                for out in pooled
            ]
        pooled = self._pool(list(pairing.texts), Pooling(), use_tqdm, truncate_prompt_tokens)
        scores = cosine_scores([out.embedding for out in pooled], pairing.pairs)
        return [
            ScoringRequestOutput(
                f"{pooled[a].request_id}_{pooled[b].request_id}",
                [*(pooled[a].prompt_token_ids or ()), *(pooled[b].prompt_token_ids or ())],
                score,
            )
            for (a, b), score in zip(pairing.pairs, scores, strict=True)
        ]

    def beam_search(
        self, prompts: str | Sequence[int] | Sequence[str | Sequence[int]], params: BeamSearchParams
    ) -> list[list[Beam]]:
        """vLLM's LLM.beam_search: each prompt's (a text or token ids) params.beam_width best
        beams, best first (actors/beam_search.py), all prompts searched at once; a bad
        params field raises ParamError, a refused round BeamSearchError."""
        batch = _prompt_list(prompts)
        encode = self.engine.tokenizer.encode
        ids = [encode(p) if isinstance(p, str) else list(p) for p in batch]
        params.check()

        async def search_all() -> list[list[Beam]]:
            found: list[list[Beam]] = [[] for _ in ids]

            async def one(i: int) -> None:
                found[i] = await beam_search(self.engine, ids[i], params)

            async with anyio.create_task_group() as tg:
                for i in range(len(ids)):
                    tg.start_soon(one, i)
            return found

        return self._portal.call(search_all)

    def _pool(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        pooling: Pooling,
        use_tqdm: bool,
        truncate_prompt_tokens: int | None = None,
    ) -> list[PoolingRequestOutput]:
        params = SamplingParams(
            max_tokens=1,
            temperature=0.0,
            pooling=pooling,
            truncate_prompt_tokens=truncate_prompt_tokens,
        )
        return [
            PoolingRequestOutput(
                request_id=out.request_id,
                prompt_token_ids=out.prompt_token_ids,
                embedding=list(out.embedding or ()),
            )
            for out in self.generate(prompts, params, use_tqdm=use_tqdm)
        ]

    def _params(self, given: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
        params = (
            self.engine.default_sampling_params() if given is None else to_sampling_params(given)
        )
        return msgspec.structs.replace(params, return_prompt_token_ids=True)

    async def _run(
        self, prompts: list[PromptInput], params: list[SamplingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        from tqdm import tqdm

        with tqdm(total=len(prompts), disable=not use_tqdm, unit="prompt") as bar:
            return await self._run_all(prompts, params, bar.update)

    async def _run_all(
        self, prompts: list[PromptInput], params: list[SamplingParams], one_done: Any
    ) -> list[RequestOutput]:
        outputs = [
            RequestOutput(
                request_id=self._new_id(),
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=None,
                outputs=[CompletionOutput(index=j) for j in range(p.n)],
            )
            for prompt, p in zip(prompts, params, strict=True)
        ]
        open_requests = set(range(len(prompts)))
        errors: list[Exception] = []
        settled, ended = anyio.Event(), anyio.Event()  # an error or all ended; all ended

        def collector(i: int) -> Any:
            def on_event(event: StreamEvent) -> None:
                if isinstance(event, Rejected | Failed):
                    kind = ValueError if isinstance(event, Rejected) else RuntimeError
                    where = (
                        f" ({event.field})" if isinstance(event, Rejected) and event.field else ""
                    )
                    errors.append(kind(f"prompt {i}{where}: {event.message}"))
                else:
                    take_event(outputs[i], event)
                if event.is_terminal:
                    open_requests.discard(i)
                    one_done(1)
                    if not open_requests:
                        ended.set()
                if errors or not open_requests:
                    settled.set()

            return on_event

        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            await self.engine.submit(prompt, p, collector(i), request_id=outputs[i].request_id)
        if prompts:
            await settled.wait()
        if errors:
            for i in sorted(open_requests):
                await self.engine.abort(outputs[i].request_id, "another prompt was refused")
            await ended.wait()  # every request ends with its one terminal event
            raise errors[0]
        return outputs

    def _new_id(self) -> str:
        self._next_id += 1
        return f"llm-{self._next_id}"


def _profiled(reply: ProfileReply) -> ProfileReply:
    if reply.error is not None:
        raise RuntimeError(f"{reply.error}: {reply.message}")
    return reply


def _score_side(field: str, given: str | Sequence[str]) -> list[Named]:
    """One side of a score call, each text named where it was given (`data_2[1]`)."""
    texts = [given] if isinstance(given, str) else list(given)
    if not texts:
        raise ValueError(f"{field} must name at least one text")
    if isinstance(given, str):
        return [(field, given)]
    return [(f"{field}[{i}]", text) for i, text in enumerate(texts)]


def _prompt_list(prompts: Any) -> list[Any]:
    """One prompt or a list of them, as a list; vLLM's prompt dicts as the text or ids they
    hold (ValueError naming a key troupe does not take)."""
    alone = isinstance(prompts, str | ChatPrompt | PromptEmbeds | Mapping) or _is_token_ids(prompts)
    return [_undict(p) for p in ([prompts] if alone else list(prompts))]


def _undict(prompt: Any) -> Any:
    if not isinstance(prompt, Mapping):
        return prompt
    if extra := sorted(set(prompt) - {"prompt", "prompt_token_ids"}):
        raise ValueError(
            f"prompt dict key(s) {', '.join(map(repr, extra))} are not served (a prompt dict "
            "holds 'prompt' or 'prompt_token_ids'; chat messages go to LLM.chat)"
        )
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")


def _is_token_ids(prompt: object) -> bool:
    return isinstance(prompt, list | tuple) and bool(prompt) and isinstance(prompt[0], int)


def _is_conversation(item: object) -> bool:
    """Whether `item` is a conversation (a list of messages), not one message."""
    return isinstance(item, list | tuple)
