"""EngineConfig.logprobs_mode (vLLM's --logprobs-mode) on the real runner (tiny random Llama,
CPU): each mode's sampled-token logprob and top-n against a torch reference computed here from
transformers' logits with the same processors (logit_bias, repetition and presence penalties,
temperature, top-k, top-p), greedy and random rows in one batch; processed modes give -inf to
what top-k drops; the tokens never depend on the mode; verified proposals give the same
logprobs as one token per step; a bad mode is a ConfigError naming the field."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from troupe.config import ConfigError, EngineConfig, LogprobsMode
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model
from troupe.messages import SamplingParams, TokenLogprob
from troupe.ops.cli import build_parser, config_from_args

from tests.gpu.test_spec_verify import BS, MAX_LEN, generate

MODES: tuple[LogprobsMode, ...] = (
    "raw_logprobs",
    "raw_logits",
    "processed_logprobs",
    "processed_logits",
)
PROMPT = [5, 17, 42, 99, 3, 250, 7, 17, 42]
RANDOM = SamplingParams(
    temperature=0.8,
    top_k=6,
    top_p=0.9,
    repetition_penalty=1.3,
    presence_penalty=0.5,
    logit_bias={3: 2.0, 17: -1.5},
    logprobs=10,  # more than top_k keeps: the processed modes show -inf among them
    seed=5,
)
GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.3, logit_bias={42: 1.0}, logprobs=3)


def _runner(folder: Path, mode: LogprobsMode | None) -> ModelRunner:
    config, model = load_model(folder, torch.float32, torch.device("cpu"), 256)
    extra = {} if mode is None else {"logprobs_mode": mode}
    options = RunnerOptions(
        block_size=4, num_gpu_blocks=64, num_cpu_blocks=8, max_model_len=256, **extra
    )
    return ModelRunner(config, model, options)


def reference(
    logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int], mode: str
) -> torch.Tensor:
    """[V] what `mode` says a row holds, from the model's logits, processors written out."""
    x = logits.float().clone()
    if mode.startswith("processed"):
        for token, bias in (params.logit_bias or {}).items():
            x[token] += bias
        for token in set(prompt) | set(output):
            x[token] = (
                x[token] / params.repetition_penalty
                if x[token] > 0
                else (x[token] * params.repetition_penalty)
            )
        for token in set(output):
            x[token] -= params.presence_penalty + params.frequency_penalty * output.count(token)
        if params.temperature > 0:
            x = x / params.temperature
            if params.top_k:
                x[x < x.topk(params.top_k).values[-1]] = -math.inf
            probs, order = x.softmax(-1).sort(descending=True)
            before = probs.cumsum(-1) - probs  # the mass of the likelier tokens kept
            x[order[before >= params.top_p]] = -math.inf
    return x.log_softmax(-1) if mode.endswith("logprobs") else x


def _check(got: TokenLogprob, want: torch.Tensor, num_top: int) -> None:
    assert got.logprob == pytest.approx(want[got.token_id].item(), abs=1e-4)
    assert math.isfinite(got.logprob)  # drawn from what the mode shows: never a dropped token
    values, ids = want.topk(num_top)
    assert len(got.top) == num_top
    for (token, value), w, i in zip(got.top, values.tolist(), ids.tolist(), strict=True):
        if math.isinf(w):
            assert value == -math.inf and math.isinf(want[token].item())
        else:
            assert (token, value) == (i, pytest.approx(w, abs=1e-4))


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_against_the_reference(hf_folder: Any, mt: SimpleNamespace, mode: str) -> None:
    folder, hf_model = hf_folder("llama")
    driver = mt.PlanDriver(_runner(folder, mode), chunk=16)
    driver.add("r", PROMPT, RANDOM)
    driver.add("g", PROMPT[2:], GREEDY)
    num_masked = 0
    for _ in range(4):
        before = {rid: (list(s.tokens), list(s.output)) for rid, s in driver.seqs.items()}
        step = driver.step()
        for rid, params in (("r", RANDOM), ("g", GREEDY)):
            tokens, output = before[rid]
            with torch.no_grad():
                logits = hf_model(torch.tensor([tokens])).logits[0, -1]
            prompt = driver.seqs[rid].prompt
            want = reference(logits, params, prompt, output, mode)
            got = step[rid].logprob
            assert got is not None and got.token_id == step[rid].token_id
            _check(got, want, params.logprobs or 0)
            num_masked += sum(math.isinf(v) for _, v in got.top[6:])
            assert all(math.isfinite(v) for _, v in got.top) or mode.startswith("processed")
    # top_k 6 of the 10 asked: the processed modes show the 4 it dropped as -inf, each step
    assert num_masked == (16 if mode.startswith("processed") else 0)


def test_tokens_do_not_depend_on_the_mode(hf_folder: Any, mt: SimpleNamespace) -> None:
    """Greedy and seeded tokens are the same in every mode, and the default is raw_logprobs
    (the same logprobs as a runner given no mode at all)."""
    folder, _ = hf_folder("llama")
    outputs = {}
    for mode in (None, *MODES):
        driver = mt.PlanDriver(_runner(folder, mode), chunk=5)
        driver.add("r", PROMPT, RANDOM)
        driver.add("g", PROMPT[2:], GREEDY)
        logprobs = []
        for _ in range(6):
            step = driver.step()
            logprobs.append({rid: token.logprob for rid, token in step.items()})
        outputs[mode] = ([s.output for s in driver.seqs.values()], logprobs)
    assert all(out[0] == outputs[None][0] for out in outputs.values())
    assert outputs["raw_logprobs"][1] == outputs[None][1]
    assert outputs["processed_logprobs"][1] != outputs[None][1]


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
def test_verified_proposals_give_the_same_logprobs(hf_folder: Any, mode: LogprobsMode) -> None:
    """The verification path (one row per proposal, penalties counting the proposals before
    it) reports what one token per step does, in processed modes too."""
    folder, _ = hf_folder("llama")
    prompt = [5, 17, 99, 3, 42, 17, 99, 3]
    n = 16

    def runner() -> ModelRunner:
        config, model = load_model(folder, torch.float32, torch.device("cpu"), MAX_LEN)
        options = RunnerOptions(
            block_size=BS, num_gpu_blocks=64, max_model_len=MAX_LEN, logprobs_mode=mode
        )
        return ModelRunner(config, model, options)

    ref, ref_lps, _ = generate(runner(), prompt, RANDOM, n, lambda t: ())

    def propose(tokens: list[int]) -> tuple[int, ...]:
        done = len(tokens) - len(prompt)
        return tuple(ref[done : done + 3])

    got, lps, accepted = generate(runner(), prompt, RANDOM, n, propose)
    assert got == ref and accepted >= n // 2
    for a, b in zip(lps, ref_lps, strict=True):
        assert a is not None and b is not None and a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top] or any(
            math.isinf(v) for _, v in a.top
        )  # -inf ties may come back in another order
        assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-4)


def test_config_and_flag() -> None:
    assert EngineConfig().logprobs_mode == "raw_logprobs"
    with pytest.raises(ConfigError, match="logprobs_mode"):
        EngineConfig(logprobs_mode="processed")  # type: ignore[arg-type]
    args = build_parser().parse_args(["serve", "--logprobs-mode", "processed_logprobs"])
    assert config_from_args(args).logprobs_mode == "processed_logprobs"


def test_parallel_samples_and_prompt_logprobs_through_the_engine(
    hf_folder: Any, tmp_path: Path
) -> None:
    """n = 2 samples of one prompt (each its own request after the fork) under
    processed_logprobs with top_k 2: each token's two kept alternatives hold all the mass;
    the prompt's logprobs are raw (finite, as vLLM's) all the same."""
    import anyio
    from graph_helpers import collect
    from troupe import Engine
    from troupe.messages import Delta, Finished

    from tests.gpu.tiny_qwen3 import tiny_folder

    folder, _ = tiny_folder(hf_folder, tmp_path)
    config = EngineConfig(
        device="cpu", model=str(folder), dtype="float32", block_size=4, num_kv_blocks=64,
        max_model_len=128, gc_freeze=False, logprobs_mode="processed_logprobs",
    )  # fmt: skip
    params = SamplingParams(
        max_tokens=3, temperature=1.0, top_k=2, n=2, seed=3, logprobs=3, prompt_logprobs=3
    )

    async def main() -> list[Any]:
        async with Engine.open(config) as engine:
            return await collect(engine, PROMPT, params)

    events = [e for e in anyio.run(main) if isinstance(e, Delta | Finished)]
    by_sample: dict[int, list[TokenLogprob]] = {0: [], 1: []}
    for event in events:
        by_sample[event.index] += event.logprobs or ()
        for scored in event.prompt_logprobs or ():
            assert all(math.isfinite(v) for _, v in scored.top)
    assert [len(v) for v in by_sample.values()] == [3, 3]
    for entry in (e for v in by_sample.values() for e in v):
        kept = [v for _, v in entry.top if math.isfinite(v)]
        assert len(kept) == 2 and entry.top[2][1] == -math.inf
        assert math.exp(kept[0]) + math.exp(kept[1]) == pytest.approx(1.0, abs=1e-5)
    assert sum(e.prompt_logprobs is not None for e in events) == 2  # each sample's first
