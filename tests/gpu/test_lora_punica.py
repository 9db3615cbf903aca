"""The punica LoRA form (EngineConfig.lora_kernel "punica": gpu/lora_linear.py, each token through
its own adapter only) against the masked form, on a fused projection through the runtime's step
preparation (Triton kernels under the interpreter, and the torch reference the CPU runs), and
through a whole engine against PEFT on a tiny random Qwen3 (fp32, CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from troupe import EngineConfig
from troupe.config import ConfigError, LoraKernel
from troupe.gpu.lora_adapter import LoraAdapter
from troupe.gpu.lora_linear import LoraLinear, LoraSlots
from troupe.gpu.lora_runtime import LoraRuntime
from troupe.gpu.quant_linear import linear

from tests.gpu.lora_steps import lora_step_inputs
from tests.gpu.test_lora_vs_peft import _config, _expected, _run_all

SLICES = (8, 4, 4)  # a fused q/k/v
IN = 24
MODULES = ("q_proj", "k_proj", "v_proj")


def _runtime(
    kernel: LoraKernel,
    use_triton: bool | None,
    *,
    slices: tuple[int, ...] = SLICES,
    in_features: int = IN,
    ranks: tuple[int, ...] = (2, 4, 3),
    max_rank: int = 4,
    max_tokens: int = 128,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> tuple[LoraRuntime, LoraLinear]:
    """A fused q/k/v projection and one adapter per rank in `ranks` (as many slots; ranks
    below max_rank: padded)."""
    slots = LoraSlots(
        len(ranks), max_rank, max_tokens, dtype, torch.device(device), kernel, use_triton
    )
    g = torch.Generator().manual_seed(9)
    weight = (torch.randn(sum(slices), in_features, generator=g) / in_features**0.5).to(device)
    proj = LoraLinear(weight.to(dtype), slices, in_features, slots)
    adapters = []
    for i, rank in enumerate(ranks):
        g = torch.Generator().manual_seed(10 + i)
        weights = {
            (0, m): (
                torch.randn(rank, in_features, generator=g) / in_features**0.5,
                torch.randn(n, rank, generator=g) / rank**0.5,
            )
            for m, n in zip(MODULES, slices, strict=True)
        }
        adapters.append(LoraAdapter(name=f"a{i}", path="", rank=rank, weights=weights))
    return LoraRuntime(adapters, slots, [(0, proj, MODULES)]), proj


@pytest.mark.parametrize("use_triton", [True, False])
def test_punica_matches_masked_on_a_mixed_batch(use_triton: bool) -> None:
    """A prefill-shaped step of three adapters and no adapter, as a graph's step is prepared
    (graphed: the tile plan written beside the slot ids; adapter 0 past one tile of 64),
    then a decode-shaped one."""
    for adapters, lens in (([0, -1, 2, 1, 0], [20, 7, 9, 1, 50]), ([2, -1, 0], [1, 1, 1])):
        inputs = lora_step_inputs(adapters, lens)
        x = torch.randn(sum(lens), IN, generator=torch.Generator().manual_seed(len(lens)))
        outs = []
        forms: tuple[tuple[LoraKernel, bool | None], ...] = (
            ("masked", None),
            ("punica", use_triton),
        )
        for kernel, triton in forms:
            runtime, proj = _runtime(kernel, triton)
            runtime.prepare(inputs, graphed=True)
            assert (proj.slots.tiles is not None) == (kernel == "punica" and use_triton)
            runtime.begin(sum(lens))
            outs.append(proj(x))
        masked, punica = outs
        torch.testing.assert_close(punica, masked, rtol=1e-5, atol=1e-5)
        base = linear(x, proj.base)  # type: ignore[arg-type]
        rows = np.repeat(np.asarray(adapters), lens) < 0
        assert torch.equal(punica[rows], base[rows])  # no adapter: exactly the base projection
        assert not torch.allclose(punica[~rows], base[~rows])


def test_lora_kernel_is_checked() -> None:
    with pytest.raises(ConfigError, match="lora_kernel must be one of masked, punica"):
        EngineConfig(lora_kernel="gather")  # type: ignore[arg-type]


def test_engine_punica_matches_peft(
    lora_setup: tuple[Path, Any, dict[str, Any]], tmp_path: Path
) -> None:
    """Every prompt under two adapters and the base model at once (steps of several adapters:
    the punica form on the CPU's reference ops): the masked form's greedy tokens, and PEFT's."""
    folder, hf_model, adapters = lora_setup
    punica = _run_all(_config(folder, tmp_path, max_loras=2, lora_kernel="punica"), None)
    masked = _run_all(_config(folder, tmp_path, max_loras=2, lora_kernel="masked"), None)
    assert punica == masked == _expected(hf_model, adapters)
