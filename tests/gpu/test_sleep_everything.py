"""Sleep mode frees everything the weights own (gpu/sleep_parts.py), on CPU runners of tiny
random models: a Qwen3 with a LoRA adapter and an EAGLE head (its own embedding), and a 4-bit
GGUF llama with a draft model. After sleep(1) no tensor reachable from the runner holds a byte
(found by walking every object the runner reaches, so a tensor someone adds later is caught);
waking gives the same greedy tokens, with and without the adapter, and the same proposals. A
level-2 sleep keeps the adapters and the head, and the weights a reload refills (poisoned
first) give the same tokens; over kept-quantized weights it is refused, nothing freed."""

from __future__ import annotations

import enum
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from troupe import EngineConfig
from troupe.gpu.lora_adapter import LoraAdapter
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.sampling_batch import SamplingBatches
from troupe.gpu.sleep_mode import ModelSleeper
from troupe.gpu.sleep_parts import Role
from troupe.gpu.sleep_state import SleepRefused
from troupe.messages import SamplingParams, StepPlan
from troupe.messages.sleep_calls import ALL_TAGS, SleepTag

from tests.gpu.conftest import FAMILIES, TINY, PlanDriver, write_random_model
from tests.gpu.eagle_heads import random_head
from tests.lora.adapters import raw_adapter

PROMPT = [(7 * j + 3) % 256 for j in range(13)]
NUM_TOKENS = 6
QWEN3 = {**TINY, **FAMILIES["qwen3"], "model_type": "qwen3", "max_position_embeddings": 128}
SHAPES = {  # QWEN3's projections (out, in): 4 heads of 32, one KV head, MLP 128
    "q_proj": (128, 64),
    "k_proj": (32, 64),
    "v_proj": (32, 64),
    "o_proj": (64, 128),
    "gate_proj": (128, 64),
    "up_proj": (128, 64),
    "down_proj": (64, 128),
}
_LEAVES = (str, bytes, int, float, bool, type, enum.Enum, np.ndarray, np.generic, torch.dtype)


def reachable_tensors(root: object, skip: tuple[type, ...]) -> dict[str, torch.Tensor]:
    """Every tensor reachable from `root` through attributes, containers and bound methods
    (breadth first: each under its shortest path), not entering `skip` instances nor
    objects of other libraries than troupe and torch.nn."""
    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    queue: list[tuple[str, object]] = [("runner", root)]
    while queue:
        path, obj = queue.pop(0)
        if id(obj) in seen or obj is None or isinstance(obj, _LEAVES + skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found[path] = obj
        elif isinstance(obj, types.MethodType):
            queue.append((f"{path}.__self__", obj.__self__))
        elif isinstance(obj, dict):
            queue += [(f"{path}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, list | tuple | set | frozenset):
            queue += [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif type(obj).__module__.startswith("troupe.") or isinstance(obj, nn.Module):
            fields = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
            for cls in type(obj).__mro__:  # slotted records (msgspec Structs)
                fields |= {
                    s: getattr(obj, s) for s in getattr(cls, "__slots__", ()) if hasattr(obj, s)
                }
            queue += [(f"{path}.{k}", v) for k, v in fields.items()]
    return found


def held_bytes(runner: ModelRunner) -> dict[str, int]:
    """Tensors the runner reaches that hold bytes: not the sleeper's host copies nor the
    adapters' (host memory by design), nor the last step's sampling rows (a few bytes per
    request, not the weights')."""
    found = reachable_tensors(runner, skip=(ModelSleeper, LoraAdapter, SamplingBatches))
    return {
        k: t.untyped_storage().nbytes() for k, t in found.items() if t.untyped_storage().nbytes()
    }


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sleep_everything")
    target = write_random_model(root / "qwen3", QWEN3, seed=0)
    return {
        "qwen3": target,
        "adapter": raw_adapter(root / "adapter", num_layers=2, shapes=SHAPES, scale=0.2),
        "head": random_head(root / "head", target, embed=True),
        "gguf": _q4_gguf(root / "q4.gguf"),
    }


def _q4_gguf(path: Path) -> Path:
    """A tiny llama GGUF whose matrices are Q4_0 (kept 4-bit: gpu/quant_linear.Int4Linear)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {
        "context_length": 128,
        "embedding_length": 64,
        "block_count": 2,
        "feed_forward_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "vocab_size": 256,
    }.items():
        writer.add_uint32(f"llama.{key}", value)
    gen = np.random.default_rng(0)
    shapes = {"token_embd.weight": (256, 64), "output_norm.weight": (64,)}
    for i in range(2):
        shapes |= {f"blk.{i}.{n}.weight": (64,) for n in ("attn_norm", "ffn_norm")}
        shapes |= {
            f"blk.{i}.attn_q.weight": (64, 64),
            f"blk.{i}.attn_k.weight": (32, 64),
            f"blk.{i}.attn_v.weight": (32, 64),
            f"blk.{i}.attn_output.weight": (64, 64),
            f"blk.{i}.ffn_gate.weight": (128, 64),
            f"blk.{i}.ffn_up.weight": (128, 64),
            f"blk.{i}.ffn_down.weight": (64, 128),
        }
    for name, shape in shapes.items():
        data = gen.standard_normal(shape).astype(np.float32) * 0.3
        if len(shape) == 1:
            writer.add_tensor(name, 1 + data)
        else:
            q4 = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q4_0)
            writer.add_tensor(name, q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _runner(folders: dict[str, Path], kind: str, **extra: Any) -> ModelRunner:
    settings: dict[str, Any] = {
        "device": "cpu",
        "dtype": "float32",
        "block_size": 4,
        "num_kv_blocks": 32,
        "max_num_seqs": 4,
        "max_model_len": 64,
        "enable_sleep_mode": True,
        "num_speculative_tokens": 2,
    }
    if kind == "lora_eagle":
        settings |= {
            "model": str(folders["qwen3"]),
            "lora_modules": (f"ad={folders['adapter']}",),
            "speculative_method": "eagle",
            "draft_model": str(folders["head"]),
        }
    else:  # the draft model is the target itself, loaded again (kept 4-bit too)
        gguf = str(folders["gguf"])
        settings |= {"model": gguf, "speculative_method": "draft_model", "draft_model": gguf}
        settings |= {"quantization": "keep", "cpu_native_kernels": False}
    return ModelRunner.from_config(EngineConfig(**(settings | extra)))


class _Run:
    """Greedy requests through a runner, one at a time, with each step's proposals."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.num_requests = 0

    def __call__(self, lora: str | None = None) -> tuple[list[int], list[tuple[int, ...]]]:
        self.num_requests += 1
        rid = f"r{self.num_requests}"
        driver = PlanDriver(self.runner, chunk=len(PROMPT))
        driver.step_id = 100 * self.num_requests
        params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, lora=lora)
        driver.add(rid, PROMPT, params)
        proposals = []
        while len(driver.seqs[rid].output) < NUM_TOKENS:
            proposals.append(driver.step()[rid].proposals)
        self.runner.execute(StepPlan(step_id=driver.step_id + 1, seqs=(), released=(rid,)))
        return driver.seqs[rid].output, proposals


@pytest.mark.parametrize("kind", ["lora_eagle", "q4_draft"])
def test_level_1_frees_every_tensor_and_wakes_to_the_same_tokens(
    folders: dict[str, Path], kind: str
) -> None:
    runner = _runner(folders, kind)
    run = _Run(runner)
    loras = [None, "ad"] if kind == "lora_eagle" else [None]
    before = [run(lora) for lora in loras]
    assert all(any(p) for _, p in before), "the draft proposes"
    roles = {h.role for h in runner.sleeper.parts()}
    assert roles == (
        {Role.WEIGHTS, Role.KEPT, Role.ZEROED}
        if kind == "lora_eagle"
        else {Role.WEIGHTS, Role.KEPT}
    )
    held = held_bytes(runner)
    assert any(".kv." in k for k in held) and any("draft" in k for k in held), sorted(held)
    message = runner.sleeper.sleep(1)
    assert "copied to CPU memory" in message
    assert held_bytes(runner) == {}
    runner.sleeper.wake_up((SleepTag.WEIGHTS,))
    runner.sleeper.wake_up((SleepTag.KV_CACHE,))
    assert held_bytes(runner).keys() == held.keys()
    assert [run(lora) for lora in loras] == before
    if kind == "lora_eagle":
        assert before[0][0] != before[1][0], "the adapter changes the tokens"


def test_level_2_reload_refills_the_weights_adapters_and_head_kept(
    folders: dict[str, Path],
) -> None:
    runner = _runner(folders, "lora_eagle", lora_kernel="punica")  # its tables sleep too
    run = _Run(runner)
    before = [run(None), run("ad")]
    assert "discarded" in runner.sleeper.sleep(2)
    assert held_bytes(runner) == {}
    runner.sleeper.wake_up(ALL_TAGS)
    for held in runner.sleeper.parts():  # what a reload must refill: poisoned
        if held.role is Role.WEIGHTS:
            torch.empty(0, dtype=torch.uint8).set_(held.storage).fill_(0xFF)
    assert "copied" in runner.weights.from_disk(str(folders["qwen3"]))
    assert [run(None), run("ad")] == before


def test_level_2_over_kept_quantized_weights_is_refused_nothing_freed(
    folders: dict[str, Path],
) -> None:
    runner = _runner(folders, "q4_draft")
    held = held_bytes(runner)
    with pytest.raises(
        SleepRefused, match=r"level 2 .* 9 served weights are kept quantized \(embed_tokens, layers"
    ):
        runner.sleeper.sleep(2)
    assert held_bytes(runner) == held and runner.sleeper.sleeping == ()
