"""POST /v1/embeddings on the real default model (SmolLM2 on the CPU, the engine in its child
process), through the official `openai` client: each vector is the engine's own for its
prompt (last-token pooling, float and base64 alike), and, checked independently of the engine,
it is the final hidden state the model's logits come from: the tied embedding matrix, read
from the GGUF file, turns the unnormalized vector into the same next-token ranking and
logprobs as a completion's. `--pooling-type mean` pools differently, as the engine does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from openai import OpenAI
from troupe.config import default_model_path
from troupe.gateway.state import GatewaySettings
from troupe.messages import Pooling, SamplingParams

from tests.gateway.conftest import ServerThread

PROMPT = "The capital of France is"
OTHER = "Embeddings map text to vectors"  # under one KV block (16 tokens), as PROMPT: no cache hit
# over one KV block: a second request for it takes a prefix-cache hit
LONG = "In the beginning the universe was created. This has made a lot of people very angry and"


@pytest.fixture(scope="module")
def client(smol: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _engine_vector(smol: ServerThread, prompt: Any, pooling: Pooling) -> np.ndarray:
    async def run() -> tuple[float, ...]:
        params = SamplingParams(max_tokens=1, temperature=0.0, pooling=pooling)
        events = [e async for e in smol.engine.generate(prompt, params)]
        assert events[0].embedding is not None, events
        return tuple(events[0].embedding)

    return np.array(smol.call(run()), dtype=np.float32)


def test_vectors_are_the_engines_own(smol: ServerThread, client: OpenAI) -> None:
    model = smol.engine.model_name
    inputs = [PROMPT, OTHER]
    expected = [_engine_vector(smol, p, Pooling()) for p in inputs]
    as_float = client.embeddings.create(model=model, input=inputs, encoding_format="float")
    by_default = client.embeddings.create(model=model, input=inputs)  # base64 under the hood
    for got in (as_float, by_default):
        vectors = [np.array(d.embedding, dtype=np.float32) for d in got.data]
        assert [v.shape for v in vectors] == [(576,), (576,)]  # SmolLM2's hidden size
        for vector, want in zip(vectors, expected, strict=True):
            np.testing.assert_allclose(vector, want, rtol=0, atol=1e-6)
            assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    assert float(expected[0] @ expected[1]) < 0.99  # two prompts, two directions
    ids = [[int(t) for t in smol.engine.tokenizer.encode(p)] for p in inputs]
    assert as_float.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    as_ids = client.embeddings.create(model=model, input=ids, encoding_format="float")
    for got_ids, want in zip(as_ids.data, expected, strict=True):
        np.testing.assert_allclose(got_ids.embedding, want, rtol=0, atol=1e-6)


def test_a_prefix_cache_hit_keeps_the_vector(smol: ServerThread, client: OpenAI) -> None:
    """Last-token pooling keeps prefix-cache hits: the second request computes only the tokens
    after the cached block. The CPU kernels (int8 activations) round a 2-token chunk and an
    18-token prompt differently: measured, the two vectors' cosine is 0.99986, and each one's
    with transformers' fp32 forward of the dequantized GGUF 0.99972, so they agree closely,
    not bit for bit."""
    model = smol.engine.model_name
    cold, warm = (
        np.array(client.embeddings.create(model=model, input=LONG).data[0].embedding)
        for _ in range(2)
    )
    assert float(cold @ warm) > 0.9995
    np.testing.assert_allclose(warm, cold, rtol=0, atol=1e-2)
    np.testing.assert_allclose(warm, _engine_vector(smol, LONG, Pooling()), rtol=0, atol=1e-6)


def test_the_vector_is_the_hidden_state_the_logits_come_from(
    smol: ServerThread, client: OpenAI
) -> None:
    import gguf

    model = smol.engine.model_name
    raw = client.embeddings.create(model=model, input=PROMPT, extra_body={"normalize": False})
    hidden = np.array(raw.data[0].embedding, dtype=np.float32)
    assert float(np.linalg.norm(hidden)) > 2.0  # not normalized
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=1, logprobs=5, temperature=0
    )
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.top_logprobs
    served = out.choices[0].logprobs.top_logprobs[0]

    reader = gguf.GGUFReader(str(default_model_path()))
    (tensor,) = [t for t in reader.tensors if t.name == "token_embd.weight"]  # tied: lm_head
    weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1, hidden.shape[0])
    logits = weight.astype(np.float32) @ hidden
    shifted = logits - logits.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    top = np.argsort(-logprobs)[:3]
    tokenizer = smol.engine.tokenizer
    # the top three are apart by over a nat: their order does not hang on rounding
    ranked = sorted(served, key=lambda text: -served[text])
    assert [tokenizer.decode([int(t)], False) for t in top] == ranked[:3]
    for t in top:  # the engine's CPU matmuls round differently (int8 activations): ~0.1
        assert logprobs[t] == pytest.approx(served[tokenizer.decode([int(t)], False)], abs=0.15)


def test_mean_pooling_setting(smol: ServerThread) -> None:
    url = smol.add_gateway(GatewaySettings(pooling_type="mean"))
    mean = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    got = mean.embeddings.create(model=smol.engine.model_name, input=LONG, encoding_format="float")
    vector = np.array(got.data[0].embedding, dtype=np.float32)
    np.testing.assert_allclose(vector, _engine_vector(smol, LONG, Pooling(type="mean")), atol=1e-6)
    last = _engine_vector(smol, LONG, Pooling())
    assert float(vector @ last) < 0.99  # another pooling, another vector
