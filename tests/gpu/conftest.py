"""Fixtures for the model tests: tiny HF models with random weights, and a plan driver."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hf_gguf import gguf_parsed_once
from troupe.config import Quantization, default_model_path
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model, random_weights
from troupe.kernels.ops import KernelBackend
from troupe.messages import SamplingParams, SeqWork, StepPlan

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}
FAMILIES: dict[str, dict[str, Any]] = {
    # llama3 rope scaling with a short original context, so scaled frequencies matter here
    "llama": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        "rope_theta": 500.0,
    },
    "qwen2": {"tie_word_embeddings": True, "rope_theta": 1000.0},
    "qwen3": {"head_dim": 32, "num_key_value_heads": 1, "rope_theta": 1000.0},  # MQA, wide heads
}


def make_hf_model(family: str, std: float = 0.2, seed: int = 0, **overrides: Any) -> Any:
    """A transformers CausalLM of the family with our random weights loaded (fp32, eval)."""
    import transformers

    kwargs = {**TINY, **FAMILIES[family], **overrides}
    cls_name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    hf_config = getattr(transformers, f"{cls_name}Config")(**kwargs)
    hf_model = getattr(transformers, f"{cls_name}ForCausalLM")(hf_config).eval()
    ours = ModelConfig.from_hf_dict(hf_config.to_dict())
    weights = random_weights(ours, torch.float32, seed, std=std)
    missing, unexpected = hf_model.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if hf_config.tie_word_embeddings:
        hf_model.tie_weights()
    return hf_model


@pytest.fixture
def hf_folder(tmp_path: Path) -> Callable[..., tuple[Path, Any]]:
    """make(family, **overrides) -> (saved HF folder, the transformers model)."""

    def make(family: str, **overrides: Any) -> tuple[Path, Any]:
        hf_model = make_hf_model(family, **overrides)
        folder = tmp_path / family
        hf_model.save_pretrained(folder)
        return folder, hf_model

    return make


def add_word_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary (w0..w255), so an engine can load a
    random HF folder."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"unk_token": "w0"}))


def write_random_model(
    folder: Path,
    cfg: dict[str, Any],
    *,
    seed: int,
    layout: Callable[[dict[str, torch.Tensor], ModelConfig], dict[str, torch.Tensor]] | None = None,
) -> Path:
    """`folder` made an HF folder Engine.open reads, without building a transformers model:
    config.json `cfg`, random safetensors weights (std 0.2: peaked logits, no greedy near-ties)
    and a word-level tokenizer. `layout` renames or fuses the tensors as a checkpoint would
    (the same seed gives the same weights in every layout)."""
    import json

    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    config = ModelConfig.from_hf_dict(cfg)
    weights = random_weights(config, torch.float32, seed=seed, std=0.2)
    if layout is not None:
        weights = layout(weights, config)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    add_word_tokenizer(folder)
    return folder


def runner_for(
    path: Path,
    *,
    num_gpu_blocks: int = 64,
    num_cpu_blocks: int = 16,
    block_size: int = 4,
    max_model_len: int = 256,
    mla_expand_min_tokens: int = 128,
    backend: KernelBackend = "auto",
    quantization: Quantization = "auto",
) -> ModelRunner:
    config, model = load_model(
        path, torch.float32, torch.device("cpu"), max_model_len, backend, quantization
    )
    options = RunnerOptions(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_model_len=max_model_len,
        mla_expand_min_tokens=mla_expand_min_tokens,
    )
    return ModelRunner(config, model, options)


def hf_greedy(hf_model: Any, prompt: list[int], num_tokens: int) -> list[int]:
    """Greedy continuation by full re-forward each step (no HF cache in the way)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(num_tokens):
            logits = hf_model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


@dataclasses.dataclass
class Seq:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    blocks: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in the cache
    output: list[int] = dataclasses.field(default_factory=list)
    started: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class PlanDriver:
    """A minimal scheduler: chunked prefill then decode, blocks from a free list."""

    def __init__(self, runner: ModelRunner, chunk: int = 5) -> None:
        self.runner = runner
        self.chunk = chunk
        self.free = list(range(runner.num_gpu_blocks))
        self.step_id = 0
        self.seqs: dict[str, Seq] = {}

    def add(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams | None = None,
        shared_blocks: list[int] | None = None,
    ) -> Seq:
        """shared_blocks: full blocks holding this prompt's prefix (a prefix-cache hit)."""
        seq = Seq(request_id, prompt, params or SamplingParams(temperature=0.0, max_tokens=64))
        if shared_blocks:
            seq.blocks = list(shared_blocks)
            seq.num_computed = len(shared_blocks) * self.runner.block_size
        self.seqs[request_id] = seq
        return seq

    def work(self, seq: Seq) -> SeqWork:
        bs = self.runner.block_size
        todo = seq.tokens[seq.num_computed :]
        tokens = todo[: self.chunk] if len(seq.output) == 0 else todo
        end = seq.num_computed + len(tokens)
        new_blocks = [self.free.pop(0) for _ in range(-(-end // bs) - len(seq.blocks))]
        first = not seq.started
        seq.blocks += new_blocks
        work = SeqWork(
            request_id=seq.request_id,
            token_ids=tuple(tokens),
            start_pos=seq.num_computed,
            block_ids=tuple(seq.blocks) if first else tuple(new_blocks),
            reset=first,
            sample=end >= len(seq.tokens),
            params=seq.params if first else None,
            num_prompt_tokens=len(seq.prompt) if first else 0,
        )
        seq.started = True
        seq.num_computed = end
        return work

    def step(self, ids: list[str] | None = None, **plan_fields: Any) -> dict[str, Any]:
        """One plan over `ids` (default: all); returns request id -> SampledToken."""
        seqs = [self.seqs[i] for i in (ids if ids is not None else list(self.seqs))]
        works = tuple(self.work(s) for s in seqs)
        self.step_id += 1
        out = self.runner.execute(StepPlan(step_id=self.step_id, seqs=works, **plan_fields))
        by_id = {t.request_id: t for t in out}
        for seq in seqs:
            if seq.request_id in by_id:
                seq.output.append(by_id[seq.request_id].token_id)
        return by_id

    def run(self, num_tokens: int) -> None:
        """Step all sequences until each has num_tokens outputs."""
        while any(len(s.output) < num_tokens for s in self.seqs.values()):
            self.step([i for i, s in self.seqs.items() if len(s.output) < num_tokens])


@pytest.fixture
def mt() -> SimpleNamespace:
    """The model-test toolkit (conftest helpers cannot be imported under importlib mode)."""
    return SimpleNamespace(
        make_hf_model=make_hf_model,
        runner_for=runner_for,
        hf_greedy=hf_greedy,
        PlanDriver=PlanDriver,
    )


@pytest.fixture(scope="session")
def hf_smollm() -> Any:
    """transformers' fp32 model of the default GGUF (SmolLM2), loaded once for the session (the
    load dequantizes every tensor in Python: ~20 s here): the greedy reference of the model
    tests. Its generation runs past EOS, as the engine's tests do."""
    transformers = pytest.importorskip("transformers")
    path = default_model_path()
    with gguf_parsed_once():  # ~8 s instead of ~20
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="session")
def q4lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The native CPU int4 kernel (gpu/cpu_q4lib.py), built once into a temporary cache;
    skips where this machine cannot build or run it."""
    from troupe.gpu.cpu_q4lib import Q4Options, load_q4

    lib = load_q4(Q4Options(cache_dir=str(tmp_path_factory.mktemp("q4cache")), threads=2))
    if lib is None:
        pytest.skip("native int4 CPU kernel unavailable here (no AVX-512 VNNI nor AVX2, or no gcc)")
    return lib


@pytest.fixture
def lora_setup(hf_folder: Any, tmp_path: Path) -> tuple[Path, Any, dict[str, Any]]:
    """A tiny Qwen3 and two PEFT adapters of it (tests/gpu/lora_reference.lora_models)."""
    from tests.gpu.lora_reference import lora_models

    return lora_models(hf_folder, tmp_path)
