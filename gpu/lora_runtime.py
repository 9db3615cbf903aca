"""The engine's LoRA adapters at run time: every adapter read (host memory: those of
lora_modules at start-up, others added and retired while the engine runs:
actors/lora_registry.py), the max_loras device slots, which adapter each slot holds, and
each step's token -> slot map.

    step: seqs  A(adapter "sql", 5 tokens)  B(none, 1)  C(adapter "chat", 1)
          slots held: 0 -> "chat", 1 -> "sql" (least recently used goes first when one is needed)
          token_slots  1 1 1 1 1  -1  0

The scheduler lets at most max_loras adapters into a step (actors/core/step_starts.py), so a
step's adapters always fit; a slot is refilled only when a step needs an adapter not held, with
copies queued on the stream after the forwards that read its old weights. Adding and
retiring run on the engine's event loop while steps run in the executor's thread: one lock
keeps the adapter list, the name -> id map and the slots consistent between them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

import numpy as np
from troupe.config import LoraKernel
from troupe.gpu.lora_adapter import LoraAdapter, load_adapter, module_shapes
from troupe.gpu.lora_linear import LoraLinear, LoraSlots
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel
from troupe.gpu.step_inputs import StepInputs

# troupe's fused projections: (attribute, the PEFT modules of its slices, in order)
_FUSED = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("o_proj", ("o_proj",)),
    ("gate_up_proj", ("gate_proj", "up_proj")),
    ("down_proj", ("down_proj",)),
)


class AdapterStore(Protocol):
    """Where the engine adds and retires adapters at run time (actors/lora_registry.py): a
    LoraRuntime, or the client of tensor-parallel workers (gpu/tp_lora_runtime.py)."""

    def add(self, name: str, path: str) -> None: ...

    def retire(self, name: str) -> None: ...


class LoraSharding(Protocol):
    """What one tensor-parallel rank holds of an adapter (gpu/tp_lora.py): its projections'
    shapes, and each adapter's factors cut to them."""

    @property
    def layer_config(self) -> ModelConfig: ...

    def shard(self, adapter: LoraAdapter) -> LoraAdapter: ...


class LoraRuntime:
    """Adapters by name (ids: their index, never reused; a retired one's entry is None), the
    slots, and the projections wrapped."""

    def __init__(
        self,
        adapters: list[LoraAdapter],
        slots: LoraSlots,
        wrapped: list[tuple[int, LoraLinear, tuple[str, ...]]],
        config: ModelConfig | None = None,
        sharding: LoraSharding | None = None,
    ) -> None:
        self.adapters: list[LoraAdapter | None] = list(adapters)
        self.ids = {a.name: i for i, a in enumerate(adapters)}
        self.slots = slots
        self.config = config  # the model's shapes, to check adapters added later
        self._sharding = sharding  # a tensor-parallel rank's cut of each adapter
        self._lock = threading.Lock()
        self._wrapped = wrapped  # (layer, projection, its slices' modules)
        self._held = [-1] * slots.max_loras  # adapter id per slot
        self._last_use = [0] * slots.max_loras
        self._clock = 0
        self.num_loads = 0  # adapters copied into a slot, so far

    @property
    def is_idle(self) -> bool:
        """Whether the step just prepared runs eagerly without any adapter."""
        return not self.slots.is_active

    def begin(self, num_tokens: int) -> None:
        """Before a forward's layers (DecoderModel.forward): the mask of its tokens."""
        self.slots.begin(num_tokens)

    def prepare(self, inputs: StepInputs, *, graphed: bool) -> None:
        """Hold the step's adapters (inputs.adapters) in slots and set how the projections run
        them (lora_linear.py): masked or punica, as the slots' kernel says (a graph's step with
        adapters, or an eager step of several; the tokens' slots written, and punica's tile
        plan), one slot (every token of an eager step on one adapter) or off (no adapter in
        the step: a graph replays its off form)."""
        num_tokens = len(inputs.input_ids)
        if num_tokens > len(self.slots.token_slots):
            raise RuntimeError(
                f"a step of {num_tokens} tokens passes the LoRA token buffer "
                f"({len(self.slots.token_slots)})"
            )
        slots, adapters = self.slots, inputs.adapters
        slots.only_slot = None
        if adapters is None or not (adapters >= 0).any():
            slots.is_active = False  # graphs: the off form's replay (graph_forms)
            return
        slots.is_active = True
        needed = np.unique(adapters[adapters >= 0]).tolist()
        with self._lock:
            lookup = np.full(len(self.adapters) + 1, -1, dtype=np.int64)  # [-1] -> no slot
            for adapter in needed:
                lookup[adapter] = self._slot_for(adapter, needed)
        if not graphed and len(needed) == 1 and (adapters >= 0).all():
            slots.only_slot = int(lookup[needed[0]])
            return
        # a graph's padding rows past num_tokens keep older slots: they are never read back
        token_slots = np.repeat(lookup[adapters], np.diff(inputs.query_start_loc))
        slots.write(token_slots)  # the punica form's tile plan too

    def _slot_for(self, adapter: int, needed: list[int]) -> int:
        self._clock += 1
        if adapter in self._held:
            slot = self._held.index(adapter)
        else:
            free = [s for s, held in enumerate(self._held) if held not in needed]
            if not free:
                raise RuntimeError(
                    f"a step runs {len(needed)} LoRA adapters; max_loras is "
                    f"{self.slots.max_loras} (the scheduler should have kept them apart)"
                )
            slot = min(free, key=self._last_use.__getitem__)
            self._load(slot, adapter)
        self._last_use[slot] = self._clock
        return slot

    def add(self, name: str, path: str) -> None:
        """Read the adapter at `path` (file reads: call it from a worker thread) and let
        requests name it; ConfigError naming it when it does not fit the model."""
        assert self.config is not None, "the runtime was installed without the model's config"
        adapter = load_adapter(name, path, self.config, self.slots.max_rank)
        if self._sharding is not None:
            adapter = self._sharding.shard(adapter)
        adapter = _on_device_dtype(adapter, self.slots)
        with self._lock:
            if name in self.ids:
                raise ValueError(f"LoRA adapter {name!r} is already loaded")
            self.adapters.append(adapter)
            self.ids[name] = len(self.adapters) - 1

    def retire(self, name: str) -> None:
        """Forget the adapter (no request may run on it any more: actors/lora_registry.py
        waits for those in flight); its host copy is freed and its slot, if any, reused."""
        with self._lock:
            adapter_id = self.ids.pop(name)
            self.adapters[adapter_id] = None
            for slot, held in enumerate(self._held):
                if held == adapter_id:
                    self._held[slot], self._last_use[slot] = -1, 0

    def _load(self, slot: int, adapter_id: int) -> None:
        adapter = self.adapters[adapter_id]
        if adapter is None:
            raise RuntimeError(f"LoRA adapter id {adapter_id} was retired while in use")
        weights = adapter.weights
        for layer, proj, modules in self._wrapped:
            for index, module in enumerate(modules):
                factors = weights.get((layer, module))
                proj.load(slot, index, *(factors if factors is not None else (None, None)))
        self._held[slot] = adapter_id
        self.num_loads += 1


def install_lora(
    model: DecoderModel,
    config: ModelConfig,
    adapters: dict[str, str],
    *,
    max_loras: int,
    max_rank: int,
    max_tokens: int,
    wrap_all: bool = False,
    sharding: LoraSharding | None = None,
    kernel: LoraKernel = "masked",
) -> LoraRuntime:
    """Read `adapters` (name -> PEFT folder), wrap the projections any of them targets (every
    one with `wrap_all`: adapters added later may target any) in `model` and set model.lora;
    the runtime. With `sharding` (a tensor-parallel rank's model), adapters are checked against
    the whole model (`config`) and held as the rank's cut of them. `kernel`: how steps of
    several adapters (and graphs' steps) run them, masked or punica (lora_linear.py)."""
    slots = LoraSlots(max_loras, max_rank, max_tokens, model.dtype, model.device, kernel)
    read = [load_adapter(name, path, config, max_rank) for name, path in adapters.items()]
    if sharding is not None:
        read = [sharding.shard(adapter) for adapter in read]
    loaded = [_on_device_dtype(adapter, slots) for adapter in read]
    targeted = {module for adapter in loaded for _, module in adapter.weights}
    if wrap_all:
        targeted = {module for _, modules in _FUSED for module in modules}
    wrapped: list[tuple[int, LoraLinear, tuple[str, ...]]] = []
    widths = module_shapes(config if sharding is None else sharding.layer_config)
    for index, layer in enumerate(model.layers):
        for attribute, modules in _FUSED:
            if targeted.isdisjoint(modules):
                continue
            if config.is_sparse(index) and attribute in ("gate_up_proj", "down_proj"):
                continue  # an MoE layer's experts (an adapter targeting them is refused)
            base = getattr(layer, attribute)
            if base is None:  # wrap_all on an ungated MLP (lora_adapter refuses adapters on it)
                continue
            layer._parameters.pop(attribute, None)  # a dense weight: a Parameter until now
            slices = tuple(widths[m][0] for m in modules)
            proj = LoraLinear(base, slices, widths[modules[0]][1], slots)
            setattr(layer, attribute, proj)
            wrapped.append((index, proj, modules))
    runtime = LoraRuntime(loaded, slots, wrapped, config, sharding)
    model.lora = runtime
    return runtime


def _on_device_dtype(adapter: LoraAdapter, slots: LoraSlots) -> LoraAdapter:
    """The factors in the model's dtype, pinned on CUDA: a slot's refill is queued copies."""
    pinned = slots.device.type == "cuda"
    for key, (a, b) in adapter.weights.items():
        a, b = a.to(slots.dtype), b.to(slots.dtype)
        adapter.weights[key] = (a.pin_memory(), b.pin_memory()) if pinned else (a, b)
    return adapter


def graph_forms(lora: LoraRuntime | None) -> tuple[bool, ...]:
    """The LoRA forms each CUDA graph is captured in (with adapters, masked or punica as the
    slots' kernel says: True): a model serving adapters gets both, so a step without any
    adapter replays the off form (no adapter GEMMs: on the H200 the masked form cost 23% of a
    batch's time whether a step used adapters or not, docs/benchmarks.md session 32); a model
    without LoRA only the plain one (False)."""
    return (False,) if lora is None else (False, True)


@contextlib.contextmanager
def captured_form(lora: LoraRuntime | None, masked: bool) -> Iterator[None]:
    """The projections run with adapters (`masked` True: the masked or punica form) or off
    while a graph of that form is captured."""
    if lora is None:
        yield
        return
    was = lora.slots.is_active, lora.slots.only_slot
    lora.slots.is_active, lora.slots.only_slot = masked, None
    try:
        yield
    finally:
        lora.slots.is_active, lora.slots.only_slot = was


def replay_form(lora: LoraRuntime | None) -> bool:
    """The form of the graph to replay for the step just prepared (LoraRuntime.prepare)."""
    return lora is not None and lora.slots.is_active
