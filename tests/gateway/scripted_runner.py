"""Runners the gateway tests steer or watch: ScriptedRunner replies with chosen tokens, so a
test can make the model say anything (markdown, `<script>`), exactly, without a model;
HeldRunner is a FaultyRunner whose held step also moves on when the gate moves past it;
ParamsRecorder records the SamplingParams each request brings to the runner; LoraEcho answers
with a token that names the request's LoRA adapter (readable from another process).

While `script` is set, the n-th token sampled for each request is `script[n % len(script)]`;
otherwise the inner runner's token passes through (the fake runner's, a function of the prompt).
Masked steps are scripted too (`finish`), past the grammar's mask.
The chosen tokens go back to the inner runner in the next plan like any sampled token, so its
KV cache stays consistent.
"""

from __future__ import annotations

import json
import threading
import zlib
from pathlib import Path
from typing import Any

import msgspec
from troupe.config import EngineConfig
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.gpu.runner import Runner
from troupe.gpu.runner_wrapper import RunnerWrapper
from troupe.messages import SampledToken, SamplingParams, StepPlan, TokenMasks


class ScriptedRunner(RunnerWrapper):
    def __init__(self, inner: Runner) -> None:
        super().__init__(inner)
        self.script: tuple[int, ...] | None = None  # set by the test between requests
        self._num_sampled: dict[str, int] = {}

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        self._release(plan)
        return self._scripted(self.inner.execute(plan))

    def launch(self, plan: StepPlan) -> None:
        self._release(plan)
        self.inner.launch(plan)

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        # a masked step (launch, then finish): the script overrides the mask too, and the
        # grammar matcher then fails the request at the first scripted token it refuses
        return self._scripted(self.inner.finish(masks))

    def _release(self, plan: StepPlan) -> None:
        for request_id in plan.released:
            self._num_sampled.pop(request_id, None)

    def _scripted(self, sampled: tuple[SampledToken, ...]) -> tuple[SampledToken, ...]:
        script = self.script
        if not script:
            return sampled
        out = []
        for token in sampled:
            n = self._num_sampled.get(token.request_id, 0)
            self._num_sampled[token.request_id] = n + 1
            out.append(msgspec.structs.replace(token, token_id=script[n % len(script)]))
        return tuple(out)


class HeldRunner(FaultyRunner):
    """`hold_after(n)` while a step is held lets it go, then n - 1 more, and holds the next:
    so a test can let requests gather at a held first step, then run an exact number of steps
    with all of them (FaultyRunner's own hold_after does not wake a step already waiting)."""

    def hold_after(self, num_steps: int) -> None:
        super().hold_after(num_steps)
        with self._cond:
            self._cond.notify_all()


class ParamsRecorder(RunnerWrapper):
    """Records each request's SamplingParams as its first plan brings them to the runner."""

    def __init__(self, inner: Runner) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()  # steps run in the executor's thread
        self.params: dict[str, SamplingParams] = {}

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        self._record(plan)
        return self.inner.execute(plan)

    def launch(self, plan: StepPlan) -> None:
        self._record(plan)
        self.inner.launch(plan)

    def _record(self, plan: StepPlan) -> None:
        with self._lock:
            self.params.update((w.request_id, w.params) for w in plan.seqs if w.params)

    def take(self, prefix: str = "") -> list[SamplingParams]:
        """The params of the requests whose id starts with `prefix`; forgets every one."""
        with self._lock:
            taken = [p for rid, p in self.params.items() if rid.startswith(prefix)]
            self.params.clear()
        return taken


def template_model(folder: Path, chat_template: str) -> Path:
    """A model folder of SmolLM2's tokenizer with `chat_template` (the fake runner needs no
    weights): for tests of what a template's format makes the gateway do."""
    from troupe.actors.core.tokenizer_files import load_tokenizer

    load_tokenizer().tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "chat_template": chat_template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def say(server: Any, text: str) -> None:
    """Make `server`'s ScriptedRunner answer exactly `text`, then EOS."""
    tokenizer = server.engine.tokenizer
    ids = tokenizer.encode(text, False)
    assert tokenizer.decode(ids) == text
    server.runner.script = (*ids, *tokenizer.eos_token_ids[:1])


class LoraEcho(RunnerWrapper):
    """Samples, for each request on a LoRA adapter, `echo_token(lora)` (the adapter's name
    inside the engine, `sql#2` for a reloaded `sql`): so a test can read, in an answer from an
    engine in another process, which adapter the runner was told to run."""

    def __init__(self, inner: Runner) -> None:
        super().__init__(inner)
        self._lora: dict[str, str] = {}  # request id -> its adapter, from its first plan

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        self._see(plan)
        return self._echo(self.inner.execute(plan))

    def launch(self, plan: StepPlan) -> None:
        self._see(plan)
        self.inner.launch(plan)

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        return self._echo(self.inner.finish(masks))

    def _see(self, plan: StepPlan) -> None:
        for request_id in plan.released:
            self._lora.pop(request_id, None)
        for work in plan.seqs:
            if work.params is not None and work.params.lora is not None:
                self._lora[work.request_id] = work.params.lora

    def _echo(self, sampled: tuple[SampledToken, ...]) -> tuple[SampledToken, ...]:
        return tuple(
            msgspec.structs.replace(t, token_id=echo_token(self._lora[t.request_id]))
            if t.request_id in self._lora
            else t
            for t in sampled
        )


def echo_token(lora: str) -> int:
    """The token LoraEcho samples on adapter `lora`: one of 1000..20999 (none of them EOS)."""
    return 1000 + zlib.crc32(lora.encode()) % 20000


def lora_echo_runner(config: EngineConfig) -> LoraEcho:
    """A picklable runner factory: the fake runner behind a LoraEcho (for the engine child)."""
    from troupe.gpu.fake_runner import FakeRunner

    return LoraEcho(FakeRunner.from_config(config))
