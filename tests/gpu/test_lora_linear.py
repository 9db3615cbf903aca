"""Batched LoRA (gpu/lora_linear.py, gpu/lora_runtime.py) against the per-token formula
y = W x + s B_a (A_a x) of each token's adapter a, on fused projections; the slots' LRU."""

from __future__ import annotations

import pytest
import torch
from troupe.gpu.lora_adapter import LoraAdapter
from troupe.gpu.lora_linear import LoraLinear, LoraSlots
from troupe.gpu.lora_runtime import LoraRuntime, captured_form, graph_forms, replay_form
from troupe.gpu.quant_linear import linear

from tests.gpu.lora_steps import lora_step_inputs

SLICES = (8, 4, 4)  # a fused q/k/v of widths 8, 4, 4
IN = 16


def _factors(rank: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rank, IN, generator=g), torch.randn(n, rank, generator=g)) for n in SLICES]


def _projection(max_loras: int = 3, max_rank: int = 4) -> tuple[LoraLinear, torch.Tensor]:
    weight = torch.randn(sum(SLICES), IN, generator=torch.Generator().manual_seed(9))
    slots = LoraSlots(max_loras, max_rank, 32, torch.float32, torch.device("cpu"))
    return LoraLinear(weight, SLICES, IN, slots), weight


def test_each_token_runs_its_own_adapter() -> None:
    """The masked form (graphs' steps, eager steps of several adapters)."""
    proj, weight = _projection()
    adapters = {0: _factors(2, 1), 2: _factors(4, 2)}  # slot -> per-slice (A, B); slot 1 empty
    for slot, factors in adapters.items():
        for index, (a, b) in enumerate(factors):
            proj.load(slot, index, a, b)
    proj.load(1, 0, None, None)
    token_slots = [-1, 0, 2, 0, -1, 2, 1]
    x = torch.randn(len(token_slots), IN, generator=torch.Generator().manual_seed(3))
    proj.slots.token_slots[: len(token_slots)] = torch.tensor(token_slots)
    proj.slots.begin(len(token_slots))
    got = proj(x)
    base = linear(x, weight)  # the base projection as the layers compute it
    for t, slot in enumerate(token_slots):
        torch.testing.assert_close(got[t], _expected(base[t], x[t], adapters.get(slot)))
    assert torch.equal(got[0], base[0]) and torch.equal(got[4], base[4])  # no adapter: exact
    assert torch.equal(got[6], base[6])  # an empty slot adds nothing


def _expected(
    base: torch.Tensor, x: torch.Tensor, factors: list[tuple[torch.Tensor, torch.Tensor]] | None
) -> torch.Tensor:
    out = base.clone()
    start = 0
    for a, b in factors or ():
        out[start : start + b.shape[0]] += b @ (a @ x)
        start += b.shape[0]
    return out


def test_one_slot_and_off() -> None:
    """An eager step whose every token runs one adapter reads that slot only; one without
    adapters adds nothing (and stale slot ids do not matter in either)."""
    proj, weight = _projection()
    factors = _factors(3, 4)
    for index, (a, b) in enumerate(factors):
        proj.load(1, index, a, b)
        proj.load(0, index, *_factors(4, 7)[index])  # another adapter beside it
    x = torch.randn(5, IN, generator=torch.Generator().manual_seed(5))
    proj.slots.token_slots[:5] = 0  # stale: the mode decides, not the buffer
    proj.slots.only_slot = 1
    proj.slots.begin(5)
    got = proj(x)
    base = linear(x, weight)  # the base projection as the layers compute it
    for t in range(5):
        torch.testing.assert_close(got[t], _expected(base[t], x[t], factors))
    proj.slots.only_slot, proj.slots.is_active = None, False
    proj.slots.begin(5)
    assert torch.equal(proj(x), base)


def test_a_refilled_slot_forgets_the_old_adapter() -> None:
    proj, weight = _projection(max_loras=1)
    for index, (a, b) in enumerate(_factors(4, 1)):
        proj.load(0, index, a, b)
    small = _factors(2, 5)  # a lower rank: the old factors' last rows must be zeroed
    for index, (a, b) in enumerate(small):
        proj.load(0, index, a, b)
    x = torch.randn(1, IN)
    proj.slots.token_slots[:1] = 0
    proj.slots.begin(1)
    expected = x[0] @ weight.T + torch.cat([b @ (a @ x[0]) for a, b in small])
    torch.testing.assert_close(proj(x)[0], expected, rtol=1e-5, atol=1e-5)


def _runtime(num_adapters: int, max_loras: int) -> tuple[LoraRuntime, LoraLinear]:
    proj, _ = _projection(max_loras=max_loras)
    adapters = []
    for i in range(num_adapters):
        factors = _factors(2, 10 + i)
        names = ("q_proj", "k_proj", "v_proj")
        weights = {(0, m): f for m, f in zip(names, factors, strict=True)}
        adapters.append(LoraAdapter(name=f"a{i}", path="", rank=2, weights=weights))
    return LoraRuntime(adapters, proj.slots, [(0, proj, ("q_proj", "k_proj", "v_proj"))]), proj


def test_slots_are_refilled_least_recently_used_first() -> None:
    runtime, _ = _runtime(num_adapters=3, max_loras=2)
    runtime.prepare(lora_step_inputs([0, -1, 1], [2, 1, 3]), graphed=True)
    slots = runtime.slots.token_slots[:6].tolist()
    assert slots[2] == -1 and slots[0] == slots[1] != slots[3] == slots[4] == slots[5]
    slot_of_1 = slots[3]
    runtime.prepare(lora_step_inputs([1], [1]), graphed=True)  # adapter 0: the least recently used
    runtime.prepare(lora_step_inputs([2, 1], [1, 1]), graphed=True)  # adapter 2 takes its slot
    assert runtime.num_loads == 3
    assert runtime.slots.token_slots[:2].tolist() == [1 - slot_of_1, slot_of_1]
    runtime.prepare(lora_step_inputs([-1, -1], [1, 1]), graphed=True)  # no adapter: the off form
    assert not runtime.slots.is_active


def test_an_eager_step_picks_its_mode() -> None:
    runtime, _ = _runtime(num_adapters=3, max_loras=2)
    slots = runtime.slots
    runtime.prepare(lora_step_inputs([2, 2], [1, 2]), graphed=False)  # one adapter for every row
    assert slots.is_active and slots.only_slot is not None
    assert runtime.slots.token_slots[0] == -1  # nothing written: the slot says it all
    runtime.prepare(lora_step_inputs([1, -1, 1, 2], [2, 1, 1, 3]), graphed=False)  # several: masked
    assert slots.is_active and slots.only_slot is None
    assert slots.token_slots[2] == -1 and slots.token_slots[0] == slots.token_slots[3]
    runtime.prepare(lora_step_inputs([0, -1], [1, 1]), graphed=False)  # one adapter, some base rows
    assert slots.is_active and slots.only_slot is None
    runtime.prepare(lora_step_inputs([-1], [4]), graphed=False)
    assert not slots.is_active and runtime.is_idle  # nothing to add
    runtime.prepare(lora_step_inputs([-1], [4]), graphed=True)
    assert not slots.is_active  # a graph replays its off form (graph_forms)
    runtime.prepare(lora_step_inputs([0], [4]), graphed=True)
    assert slots.is_active and slots.only_slot is None  # one adapter in a graph: masked


def test_graphs_capture_both_forms_and_replay_the_prepared_one() -> None:
    runtime, _ = _runtime(num_adapters=2, max_loras=2)
    assert graph_forms(runtime) == (False, True)
    runtime.prepare(lora_step_inputs([1], [2]), graphed=False)  # an eager one-slot step ran last
    with captured_form(runtime, False):
        assert not runtime.slots.is_active and replay_form(runtime) is False
    with captured_form(runtime, True):
        assert runtime.slots.is_active and runtime.slots.only_slot is None
    assert runtime.slots.is_active and runtime.slots.only_slot is not None  # restored
    runtime.prepare(lora_step_inputs([-1, 0], [1, 1]), graphed=True)
    assert replay_form(runtime) is True
    runtime.prepare(lora_step_inputs([-1, -1], [1, 1]), graphed=True)
    assert replay_form(runtime) is False
    assert graph_forms(None) == (False,) and replay_form(None) is False


def test_more_adapters_than_slots_in_one_step_is_an_error() -> None:
    runtime, _ = _runtime(num_adapters=3, max_loras=2)
    with pytest.raises(RuntimeError, match="runs 3 LoRA adapters; max_loras is 2"):
        runtime.prepare(lora_step_inputs([0, 1, 2], [1, 1, 1]), graphed=False)
