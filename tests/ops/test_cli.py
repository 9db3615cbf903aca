"""The `troupe` command: generate streams text; flags mirror EngineConfig; errors are clear."""

from __future__ import annotations

import subprocess
import sys

import pytest
from troupe.config import EngineConfig
from troupe.ops.cli import build_parser, config_from_args


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
def test_bench_help_comes_from_each_benchmark(workload: str) -> None:
    out = run("bench", workload, "--help")
    assert out.returncode == 0 and "--num-seqs" in out.stdout


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
