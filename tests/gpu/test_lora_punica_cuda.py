"""The punica LoRA form on CUDA (gpu/lora_linear.py; kernels/lora_shrink.py, lora_expand.py):
against the masked form in bf16, eager and inside a CUDA graph that replays steps of other
adapter mixes and fewer tokens, and through the engine (fp32, graphs and overlap) against PEFT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from troupe.config import LoraKernel
from troupe.gpu.quant_linear import linear

from tests.gpu.lora_steps import lora_step_inputs
from tests.gpu.test_lora_punica import _runtime
from tests.gpu.test_lora_vs_peft import _expected, _run_all
from tests.gpu.tiny_qwen3 import cuda_config

pytestmark = pytest.mark.gpu

# realistic widths: a fused q/k/v of 1,024 + 256 + 256 from 1,024, four adapters of rank <= 16
SHAPES: dict[str, Any] = {
    "slices": (1024, 256, 256),
    "in_features": 1024,
    "ranks": (16, 8, 16, 4),
    "max_rank": 16,
    "max_tokens": 4096,
    "dtype": torch.bfloat16,
    "device": "cuda",
}


def _formula(x: torch.Tensor, proj: Any, token_slots: np.ndarray) -> torch.Tensor:
    """fp32 y = W x + B_l A_l x per token, from the slots' factors."""
    slots, num_slices = proj.slots, len(proj.slices)
    a = proj.a_all.float().view(slots.max_loras, num_slices, slots.max_rank, -1)
    out = x.float() @ proj.base.float().t()
    for t, slot in enumerate(token_slots.tolist()):
        if slot < 0:
            continue
        u = (a[slot] @ x[t].float()).reshape(-1)  # [S R]
        start = 0
        for index, size in enumerate(proj.slices):
            r = slots.max_rank
            b = proj.b_all[start : start + size, slot * r : (slot + 1) * r].float()
            out[t, start : start + size] += b @ u[index * r : (index + 1) * r]
            start += size
    return out


def _step(adapters: list[int], lens: list[int]) -> tuple[Any, torch.Tensor]:
    g = torch.Generator().manual_seed(sum(lens))
    x = torch.randn(sum(lens), SHAPES["in_features"], generator=g)
    return lora_step_inputs(adapters, lens), x.to(SHAPES["device"], SHAPES["dtype"])


@pytest.mark.parametrize(
    ("adapters", "lens"),
    [
        ([0, -1, 2, 1, 3, 0], [700, 300, 1000, 5, 64, 1]),  # prefill-shaped: 2,070 tokens
        (list(range(-1, 4)) * 13, [1] * 65),  # decode-shaped: 65 tokens, one each
    ],
)
def test_punica_matches_masked_in_bf16(adapters: list[int], lens: list[int]) -> None:
    inputs, x = _step(adapters, lens)
    token_slots = np.repeat(np.asarray(adapters), lens)
    outs = {}
    kernels: tuple[LoraKernel, ...] = ("masked", "punica")
    for kernel in kernels:
        runtime, proj = _runtime(kernel, None, **SHAPES)
        runtime.prepare(inputs, graphed=True)
        runtime.begin(len(x))
        outs[kernel] = proj(x).float()
    slots = runtime.slots.token_slots[: len(x)].cpu().numpy()
    reference = _formula(x, proj, slots)
    assert (slots >= 0).tolist() == (token_slots >= 0).tolist()
    for out in outs.values():
        torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs["punica"], outs["masked"], rtol=2e-2, atol=2e-2)
    base = linear(x, proj.base).float()
    none = torch.from_numpy(token_slots < 0).to(x.device)
    assert torch.equal(outs["punica"][none], base[none])


def test_a_graph_replays_other_steps() -> None:
    """Captured once at 256 rows in the punica form; each replay runs the step just prepared
    (other adapters, fewer real rows): the rows past the step's are the base projection's."""
    runtime, proj = _runtime("punica", None, **SHAPES)
    x = torch.zeros(256, SHAPES["in_features"], dtype=torch.bfloat16, device="cuda")
    runtime.prepare(_step([0, 1], [128, 128])[0], graphed=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        proj(x)  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = proj(x)
    for adapters, lens in (([3, -1, 2], [100, 50, 106]), ([1, 0, -1, 2, 3], [1, 1, 1, 1, 1])):
        inputs, step_x = _step(adapters, lens)
        runtime.prepare(inputs, graphed=True)
        x.normal_()  # the rows past the step's: no adapter may touch them
        x[: len(step_x)] = step_x
        graph.replay()
        slots = runtime.slots.token_slots[: len(step_x)].cpu().numpy()
        got = out.float()
        torch.testing.assert_close(
            got[: len(step_x)], _formula(step_x, proj, slots), rtol=2e-2, atol=2e-2
        )
        base = linear(x, proj.base)[len(step_x) :].float()  # eager: another GEMM may round
        torch.testing.assert_close(got[len(step_x) :], base, rtol=2e-2, atol=5e-2)


def test_engine_punica_on_cuda_with_graphs_and_overlap(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    """Decode graphs, mixed-step graphs (12-token steps) and overlapped decodes in the punica
    form: each row runs its own adapter (fp32: greedy equals PEFT's)."""
    folder, hf_model, adapters = lora_setup
    config = cuda_config(folder).replace(
        lora_modules=(f"all={tmp_path / 'all'}", f"qv={tmp_path / 'qv'}"),
        max_lora_rank=8,
        max_loras=2,
        lora_kernel="punica",
    )
    assert _run_all(config, None) == _expected(hf_model, adapters)


def test_the_kernel_bench_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """ops/lora_kernel_bench.py: each projection, a graph-replayed and an eager step; the
    punica and masked outputs agree (its last column)."""
    from troupe.ops.lora_kernel_bench import main

    assert main(["--tokens", "8", "600", "--repeats", "2", "--no-adapter-share", "0.25"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert [row.split()[:2] for row in rows] == [
        [name, tokens] for name in ("qkv", "gate_up", "down") for tokens in ("8", "600")
    ]
    assert all(float(row.split()[-1]) < 0.1 for row in rows)
