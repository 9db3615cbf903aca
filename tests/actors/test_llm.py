"""troupe.LLM, vLLM's offline entry point: one engine across synchronous calls, outputs in
prompt order with each prompt's samples, chat through the template, refusals raised naming the
prompt (the others aborted, the engine still serving); asyncio and trio loops alike."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from troupe import LLM, EngineConfig, Pooling, SamplingParams, generate_batch
from troupe.actors.beam_search import BeamSearchParams
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import ParamError

CONFIG = EngineConfig(runner="fake", num_kv_blocks=512, num_cpu_blocks=8, max_num_seqs=8)
GREEDY = SamplingParams(max_tokens=5, temperature=0.0)


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def llm(request: pytest.FixtureRequest) -> Iterator[LLM]:
    with LLM(CONFIG, backend=request.param) as engine:
        yield engine


def test_outputs_come_in_prompt_order_with_their_samples(llm: LLM) -> None:
    prompts: list = [[100 + i] * (3 + i) for i in range(12)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=5, temperature=0.0, n=2))
    assert len(outs) == 12 and len({o.request_id for o in outs}) == 12
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.prompt_token_ids == prompt and out.prompt is None and out.finished
        assert [s.index for s in out.outputs] == [0, 1]
        want = FakeRunner.reference_tokens(prompt, 5, GREEDY)
        assert all(s.token_ids == want and s.finish_reason == "length" for s in out.outputs)
    text = llm.generate("The theatre troupe", GREEDY)  # one prompt alone, text
    assert len(text) == 1 and text[0].prompt == "The theatre troupe"
    tokenizer = llm.get_tokenizer()
    assert text[0].prompt_token_ids == tokenizer.encode("The theatre troupe")
    assert text[0].outputs[0].text == tokenizer.decode(text[0].outputs[0].token_ids)


def test_a_progress_bar_unless_told_not_to(llm: LLM, capfd: pytest.CaptureFixture[str]) -> None:
    llm.generate([[1, 2, 3], [4, 5, 6]], GREEDY)
    assert "2/2" in capfd.readouterr().err  # vLLM's default: a bar of finished prompts
    llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert capfd.readouterr().err == ""


def test_vllms_prompt_dicts(llm: LLM) -> None:
    by_ids = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)
    assert by_ids[0].prompt_token_ids == [5, 6, 7]
    both = llm.generate([{"prompt": "The theatre"}, [5, 6, 7]], GREEDY, use_tqdm=False)
    assert both[0].prompt == "The theatre" and both[1].outputs == by_ids[0].outputs
    with pytest.raises(ValueError, match="'multi_modal_data'"):
        llm.generate({"prompt": "x", "multi_modal_data": {}}, GREEDY)
    beams = llm.beam_search([{"prompt_token_ids": [5, 6, 7]}], BeamSearchParams(beam_width=2))
    assert len(beams[0]) == 2


def test_the_engine_lives_across_calls(llm: LLM) -> None:
    prompt = [5 + i % 40 for i in range(64)]
    first = llm.generate([prompt], GREEDY)[0]
    again = llm.generate([prompt], [GREEDY])[0]  # the first call's blocks are cached
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    rows = llm.generate(prompt, SamplingParams(max_tokens=3, temperature=0.0, logprobs=1))[0]
    sample = rows.outputs[0]
    assert sample.logprobs is not None and [r.token_id for r in sample.logprobs] == sample.token_ids
    assert sample.cumulative_logprob == pytest.approx(sum(r.logprob for r in sample.logprobs))


def test_chat_renders_each_conversation(llm: LLM) -> None:
    one = [{"role": "user", "content": "Hi"}]
    two = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    tokenizer = llm.get_tokenizer()
    outs = llm.chat([one, two], GREEDY)
    for conversation, out in zip((one, two), outs, strict=True):
        rendered = tokenizer.render_chat(conversation, add_generation_prompt=True)
        assert out.prompt_token_ids == tokenizer.encode(rendered, False)
    alone = llm.chat(one, GREEDY, add_generation_prompt=False)
    assert len(alone) == 1 and alone[0].prompt_token_ids != outs[0].prompt_token_ids


def test_embed_pools_each_prompt(llm: LLM) -> None:
    prompts: list = [[9, 8, 7, 6, 5], [1, 2, 3]]
    outs = llm.embed(prompts)
    assert [o.prompt_token_ids for o in outs] == prompts
    assert all(sum(v * v for v in o.embedding) == pytest.approx(1.0) for o in outs)
    mean = llm.embed(prompts, Pooling(type="mean", normalize=False))
    assert mean[0].embedding != outs[0].embedding != outs[1].embedding
    with pytest.raises(ValueError, match="classif"):  # no score head on this model
        llm.classify(prompts)


def test_score_on_an_embedding_model_is_the_cosine_of_the_embeddings(llm: LLM) -> None:
    texts = ["a b c", "d e", "a b c", "f"]
    vectors = {t: o.embedding for t, o in zip(texts, llm.embed(texts), strict=True)}

    def cosine(a: str, b: str) -> float:  # the vectors are unit length
        return sum(x * y for x, y in zip(vectors[a], vectors[b], strict=True))

    outs = llm.score("a b c", texts[1:], use_tqdm=False)  # 1:N
    assert [o.outputs.score for o in outs] == pytest.approx([cosine("a b c", t) for t in texts[1:]])
    assert outs[1].outputs.score == pytest.approx(1.0) and outs[0].outputs.score < 0.999
    pair = llm.score(["d e", "f"], ["a b c", "d e"], use_tqdm=False)  # N:N
    assert [o.outputs.score for o in pair] == pytest.approx(
        [cosine("d e", "a b c"), cosine("f", "d e")]
    )
    encode = llm.get_tokenizer().encode
    assert pair[0].prompt_token_ids == encode("d e") + encode("a b c")
    with pytest.raises(ValueError, match="data_2 must name at least one text"):
        llm.score("a", [])


def test_beam_search_gives_each_prompt_its_best_beams(llm: LLM) -> None:
    params = BeamSearchParams(beam_width=3, max_tokens=4)
    found = llm.beam_search(["Once upon a time", [7, 8, 9]], params)
    assert len(found) == 2 and all(len(beams) == 3 for beams in found)
    for beams in found:
        scores = [b.score for b in beams]
        assert scores == sorted(scores, reverse=True) and len(set(b.token_ids for b in beams)) == 3
    tokenizer = llm.get_tokenizer()
    assert found[0][0].text == tokenizer.decode(list(found[0][0].token_ids))
    alone = llm.beam_search("Once upon a time", params)
    assert [b.token_ids for b in alone[0]] == [b.token_ids for b in found[0]]
    with pytest.raises(ParamError, match="beam_width"):
        llm.beam_search("x", BeamSearchParams(beam_width=0))


def test_a_refused_prompt_raises_and_the_rest_are_aborted(llm: LLM) -> None:
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    with pytest.raises(ValueError, match=r"prompt 1 \(prompt\): .*empty"):
        llm.generate([[1, 2, 3], "", [4, 5, 6]], long)
    with pytest.raises(ValueError, match="temperature"):
        llm.generate("x", {"temperature": -1.0})
    with pytest.raises(ValueError, match="2 sampling_params for 1 prompts"):
        llm.generate(["a"], [GREEDY, GREEDY])
    assert llm.generate([[1, 2, 3]], GREEDY)[0].outputs[0].finish_reason == "length"


def test_engine_fields_as_keywords() -> None:
    with pytest.raises(TypeError, match="'max_model_length'"):
        LLM(CONFIG, max_model_length=64)
    with LLM(CONFIG, max_model_len=64) as small:
        assert small.engine.max_model_len == 64
        with pytest.raises(ValueError, match="max_model_len"):
            small.generate([list(range(1, 80))], GREEDY)


def test_profiling_around_generate(llm: LLM, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"profiling_off.*profiler"):
        llm.start_profile()
    with LLM(CONFIG, profiler_dir=str(tmp_path)) as profiled:
        profiled.start_profile()
        profiled.generate([[1, 2, 3]], GREEDY)
        path = Path(profiled.stop_profile())
        assert path.parent == tmp_path and path.is_file()
        with pytest.raises(RuntimeError, match="no_profile_running"):
            profiled.stop_profile()


def test_generate_batch_refuses_parallel_samples() -> None:
    with pytest.raises(ValueError, match=r"troupe\.LLM"):
        generate_batch(["a"], SamplingParams(n=2), CONFIG, progress=False)


def test_an_llm_left_open_lets_the_interpreter_exit(tmp_path: Path) -> None:
    """Its loop runs in a daemon thread and its finalizer stops the engine at exit: a script
    that never calls close() still ends (the timeout is a hang guard only)."""
    script = tmp_path / "left_open.py"
    script.write_text(
        "from troupe import LLM, EngineConfig, SamplingParams\n"
        "llm = LLM(EngineConfig(runner='fake', num_kv_blocks=64, num_cpu_blocks=4))\n"
        "print(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("[")
