"""The CPU single-sequence decode path (gpu/cpu_decode.py) with LoRA adapters loaded on the
default model: built on the base weights, it runs a base request's decode steps (the same
tokens as an engine without adapters) and stands aside for a request on an adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from troupe import Engine, EngineConfig
from troupe.gpu.cpu_decode import CpuDecode
from troupe.gpu.model_runner import ModelRunner
from troupe.gpu.step_inputs import StepInputs
from troupe.messages import SamplingParams

from tests.lora.adapters import SMOLLM2_SHAPES as SHAPES
from tests.lora.adapters import raw_adapter

PROMPT = [1, 504, 3458, 282, 4649, 314]  # a few SmolLM2 token ids


class _Counted:
    """The fast path, counting the steps it runs."""

    def __init__(self, inner: CpuDecode) -> None:
        self.inner, self.calls = inner, 0

    def fits(self, inputs: StepInputs) -> bool:
        return self.inner.fits(inputs)

    def __call__(self, inputs: StepInputs) -> Any:
        self.calls += 1
        return self.inner(inputs)


def _tokens(
    config: EngineConfig, runner: ModelRunner | None, loras: list[str | None]
) -> list[list[int]]:
    async def main() -> list[list[int]]:
        out = []
        async with Engine.open(config, runner=runner) as engine:
            for lora in loras:
                params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, lora=lora)
                out.append([t async for e in engine.generate(PROMPT, params) for t in e.token_ids])
        return out

    return anyio.run(main)


def test_base_requests_keep_the_fast_path(tmp_path: Path) -> None:
    folder = raw_adapter(tmp_path / "tiny", num_layers=30, shapes=SHAPES, scale=0.06)
    base = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=16, max_num_seqs=2)
    lora = base.replace(lora_modules=(f"tiny={folder}",))
    runner = ModelRunner.from_config(lora)
    fast = runner._pass.cpu_decode
    assert fast is not None, "the fast path is built on the base weights"
    counted = _Counted(fast)
    runner._pass.cpu_decode = counted  # type: ignore[assignment]
    [plain] = _tokens(base, None, [None])
    with_base, with_adapter = _tokens(lora, runner, [None, "tiny"])
    assert with_base == plain  # bit-identical: the same fast path on the same weights
    assert with_adapter != plain
    assert counted.calls == 7  # the base request's decode steps; none of the adapter's
