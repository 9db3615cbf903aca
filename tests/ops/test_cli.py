"""The `troupe` command: generate streams text; flags mirror EngineConfig; errors are clear."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from troupe.config import EngineConfig
from troupe.gpu.runner import Runner, build_runner
from troupe.messages import SamplingParams
from troupe.messages.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from troupe.ops.cli import (
    DEFAULT_MAX_TOKENS,
    build_parser,
    config_from_args,
    main,
    sampling_params_from_args,
)

from tests.actors.test_generation_defaults import model_folder
from tests.gateway.scripted_runner import ParamsRecorder


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe", *args], capture_output=True, text=True, timeout=120
    )


def test_generate_streams_text_with_the_fake_runner() -> None:
    out = run("generate", "Hello", "--runner", "fake", "--max-tokens", "5", "--num-kv-blocks", "64")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()  # the streamed text
    assert "[length] 5 tokens" in out.stderr


def test_every_config_field_is_a_flag() -> None:
    ns = build_parser().parse_args(
        [
            "generate",
            "x",
            "--max-num-seqs",
            "7",
            "--no-enable-prefix-caching",
            "--preemption-mode",
            "swap",
            "--num-kv-blocks",
            "99",
        ]
    )
    config = config_from_args(ns)
    assert config == EngineConfig(
        max_num_seqs=7, enable_prefix_caching=False, preemption_mode="swap", num_kv_blocks=99
    )


def test_lora_modules_take_several_values() -> None:
    ns = build_parser().parse_args(
        ["generate", "x", "--lora-modules", "sql=/a/sql", "chat=/b/chat", "--max-loras", "2"]
    )
    config = config_from_args(ns)
    assert config.lora_modules == ("sql=/a/sql", "chat=/b/chat") and config.max_loras == 2
    assert config.lora_adapters == {"sql": "/a/sql", "chat": "/b/chat"}
    default = config_from_args(build_parser().parse_args(["generate", "x"]))
    assert default.lora_modules == ()


def test_lora_modules_take_vllms_json_form(capsys: pytest.CaptureFixture[str]) -> None:
    sql = '{"name": "sql", "path": "/a/sql", "base_model_name": "meta-llama/Llama-3.1-8B"}'
    for command in (["generate", "x"], ["serve"], ["run-batch", "-i", "a", "-o", "b"]):
        ns = build_parser().parse_args([*command, "--lora-modules", sql, "chat=/b/chat"])
        assert config_from_args(ns).lora_adapters == {"sql": "/a/sql", "chat": "/b/chat"}
    refused = {
        '{"name": "sql", "path": "/a", "scale": 2}': "unknown field 'scale'",
        '{"name": "sql"}': "needs 'name' and 'path' strings",
        '{"name": "sql", "path": 7}': "needs 'name' and 'path' strings",
        '{"name": "sql",': "not JSON",
    }
    for value, words in refused.items():
        with pytest.raises(SystemExit):
            build_parser().parse_args(["generate", "x", "--lora-modules", value])
        assert "--lora-modules" in (err := capsys.readouterr().err) and words in err, value


def test_generate_lora_sets_the_requests_adapter() -> None:
    ns = build_parser().parse_args(["generate", "x", "--lora", "sql"])
    assert sampling_params_from_args(ns, NO_DEFAULTS, 2048).lora == "sql"
    ns = build_parser().parse_args(["generate", "x"])
    assert sampling_params_from_args(ns, NO_DEFAULTS, 2048).lora is None


def test_policy_flags_offer_the_registries_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "x", "--scheduling-policy", "lifo"])
    assert "choose from fcfs, priority" in capsys.readouterr().err.replace("'", "")
    ns = build_parser().parse_args(["generate", "x", "--scheduling-policy", "fcfs"])
    assert config_from_args(ns).scheduling_policy == "fcfs"


def test_bad_config_value_names_the_field() -> None:
    out = run("generate", "x", "--block-size", "3")
    assert out.returncode == 2
    assert "block_size must be a power of two" in out.stderr


@pytest.mark.parametrize("workload", ["graph", "scheduler", "offline"])
def test_bench_help_comes_from_each_benchmark(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process: `python -m troupe` reaching main is the other tests' (a child each)."""
    with pytest.raises(SystemExit) as exit_:
        main(["bench", workload, "--help"])
    assert exit_.value.code == 0 and "--num-seqs" in capsys.readouterr().out


def test_draft_model_flags_for_generate_and_serve() -> None:
    flags = ["--speculative-method", "draft_model", "--draft-model", "small/", "--num-speculative-tokens", "3"]  # fmt: skip
    expected = EngineConfig(
        speculative_method="draft_model", draft_model="small/", num_speculative_tokens=3
    )
    for command in (["generate", "x"], ["serve"]):
        assert config_from_args(build_parser().parse_args([*command, *flags])) == expected
    out = run("generate", "x", "--speculative-method", "draft_model")
    assert out.returncode == 2
    assert "needs draft_model" in out.stderr


def _params(
    flags: list[str], defaults: SamplingDefaults, max_model_len: int = 2048
) -> SamplingParams:
    ns = build_parser().parse_args(["generate", "x", *flags])
    return sampling_params_from_args(ns, defaults, max_model_len)


def test_generate_flags_left_out_take_the_models_defaults() -> None:
    defaults = SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20, min_p=0.05)
    assert _params([], defaults) == SamplingParams(
        temperature=0.6, top_p=0.95, top_k=20, min_p=0.05, max_tokens=DEFAULT_MAX_TOKENS
    )
    # a flag given wins, the others still come from the model
    flags = ["--temperature", "0", "--top-k", "5", "--max-tokens", "7", "--sampling-seed", "3"]
    assert _params(flags, defaults) == SamplingParams(
        temperature=0.0, top_p=0.95, top_k=5, min_p=0.05, max_tokens=7, seed=3
    )
    # the model's max_new_tokens is the default max_tokens, never past max_model_len
    assert _params([], SamplingDefaults(max_tokens=300), max_model_len=128).max_tokens == 128
    assert _params([], SamplingDefaults(max_tokens=30)).max_tokens == 30
    # no defaults from the model: SamplingParams' own, the CLI's max_tokens
    assert _params([], NO_DEFAULTS) == SamplingParams(max_tokens=DEFAULT_MAX_TOKENS)
    assert _params(["--repetition-penalty", "1.1", "--min-p", "0.1"], NO_DEFAULTS) == (
        SamplingParams(repetition_penalty=1.1, min_p=0.1, max_tokens=DEFAULT_MAX_TOKENS)
    )


def test_generate_runs_the_model_folders_generation_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`troupe generate` in-process: the runner sees the file's values for the flags left out
    and the flags' values where given (the old CLI sent temperature 0.0, top_k 0)."""
    file = {"temperature": 0.6, "top_k": 20, "max_new_tokens": 4, "do_sample": True}
    folder = model_folder(tmp_path / "model", file)
    recorders: list[ParamsRecorder] = []

    def recording_runner(config: EngineConfig) -> Runner:
        recorders.append(ParamsRecorder(build_runner(config)))
        return recorders[-1]

    monkeypatch.setattr("troupe.actors.executor.build_runner", recording_runner)
    flags = ["--runner", "fake", "--model", str(folder), "--num-kv-blocks", "64"]
    assert main(["generate", "Hello", *flags]) == 0
    assert recorders[-1].take() == [SamplingParams(temperature=0.6, top_k=20, max_tokens=4)]
    assert "[length] 4 tokens" in capsys.readouterr().err
    assert main(["generate", "Hello", *flags, "--top-k", "3", "--max-tokens", "2"]) == 0
    assert recorders[-1].take() == [SamplingParams(temperature=0.6, top_k=3, max_tokens=2)]
