"""generate_batch: the synchronous offline API, and Engine.submit under it."""

from __future__ import annotations

import pytest
from troupe import EngineConfig, Pooling, SamplingParams, generate_batch
from troupe.gpu.fake_runner import FakeRunner


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_generate_batch_returns_outputs_in_prompt_order(backend: str) -> None:
    config = EngineConfig(runner="fake", num_kv_blocks=512, num_cpu_blocks=8, max_num_seqs=8)
    prompts: list = [[100 + i] * (3 + i) for i in range(20)]
    prompts.append("")  # rejected, and reported as such
    params = SamplingParams(max_tokens=5, temperature=0.0)
    results = generate_batch(prompts, params, config, progress=False, backend=backend)
    assert len(results) == 21
    for prompt, out in zip(prompts[:20], results[:20], strict=True):
        assert out.token_ids == FakeRunner.reference_tokens(prompt, 5, params)
        assert out.finish_reason == "length" and out.error is None
        assert out.usage is not None and out.usage.completion_tokens == 5
    assert results[20].finish_reason == "rejected" and "prompt" in (results[20].error or "")


def test_generate_batch_per_prompt_params_must_match_length() -> None:
    with pytest.raises(ValueError, match="2 params for 1 prompts"):
        generate_batch(["a"], [SamplingParams(), SamplingParams()], progress=False)


def test_generate_batch_keeps_logprobs_and_prompt_logprobs() -> None:
    config = EngineConfig(
        runner="fake", num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=4
    )
    prompts = [[7 + (3 * j) % 50 for j in range(n)] for n in (5, 40)]  # 40: four chunks
    params = SamplingParams(max_tokens=3, temperature=0.0, logprobs=0, prompt_logprobs=2)
    results = generate_batch(prompts, params, config, progress=False)
    for prompt, out in zip(prompts, results, strict=True):
        assert out.logprobs is not None
        assert [lp.token_id for lp in out.logprobs] == out.token_ids
        assert out.prompt_logprobs is not None
        assert [lp.token_id for lp in out.prompt_logprobs] == prompt[1:]  # in order, each once
        assert all(len(lp.top) == 2 for lp in out.prompt_logprobs)
    plain = generate_batch(prompts[:1], SamplingParams(max_tokens=2), config, progress=False)
    assert plain[0].logprobs is None and plain[0].prompt_logprobs is None


def test_generate_batch_keeps_embeddings() -> None:
    config = EngineConfig(runner="fake", num_kv_blocks=64, max_num_seqs=4, block_size=4)
    prompts = [[9, 8, 7, 6, 5], [1, 2, 3]]
    params = SamplingParams(max_tokens=2, pooling=Pooling(type="mean"))
    pooled = generate_batch(prompts, params, config, progress=False)
    for out in pooled:
        assert out.embedding is not None
        assert sum(v * v for v in out.embedding) == pytest.approx(1.0)  # normalized
    assert pooled[0].embedding != pooled[1].embedding
    plain = generate_batch(prompts, SamplingParams(max_tokens=2), config, progress=False)
    assert plain[0].embedding is None
