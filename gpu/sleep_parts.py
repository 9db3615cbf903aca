"""What a sleep frees (gpu/sleep_mode.py): every tensor the served model and its companions own
on the device, found by walking their module trees, each storage once (tied embeddings, fused
views and a head's share of the target's tensors are one storage), sorted by what becomes of
it while the weights sleep:

    WEIGHTS  the served model's parameters, dense or kept-quantized (gpu/quant_linear.py), and
             LoRA-wrapped projections' bases: level 1 copies them to the host, level 2 drops
             them (update_weights_from_disk / _from_tensors refill every one: weight_update.py)
    KEPT     what no reload refills: buffers (rotary tables; vLLM keeps buffers at level 2
             too), a draft model's or EAGLE / MTP head's weights and buffers, the LoRA slots
             (the adapters they hold) and their bookkeeping: copied to the host at either level
    ZEROED   what holds nothing from one step to the next (the hidden rows an EAGLE head reads):
             back zero-filled

Kept-quantized weights of the served model are WEIGHTS a reload cannot refill (it copies into
dense weights only): a level-2 sleep is refused while any is served (`quantized` names them).
The KV pools are not here: they sleep under the "kv_cache" tag (KVCache.free / reallocate).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.lora_linear import LoraLinear
from troupe.gpu.models import DecoderModel
from troupe.gpu.quant_linear import Fp8Linear, Int4Linear, Int8Linear


class Role(enum.Enum):
    """What a sleep does with a storage (the module docstring)."""

    WEIGHTS = "weights"
    KEPT = "kept"
    ZEROED = "zeroed"


class Companion(Protocol):
    """What sleeps beside the served model: a draft model or an EAGLE / MTP head with its own
    KV pool (gpu/proposer.Proposer)."""

    kv: KVCache

    def sleep_modules(self) -> tuple[nn.Module, ...]:
        """The modules whose tensors sleep with the weights (KEPT: nothing reloads them)."""
        ...

    def drop_graphs(self) -> None:
        """Release what read the old addresses (CUDA graphs, the CPU decode's bindings)."""
        ...

    def capture_graphs(self) -> None:
        """Once everything is awake: the graphs again, its pool as at start."""
        ...


@dataclasses.dataclass(frozen=True)
class Held:
    """One storage a sleep frees: the first name found for it, and what becomes of it."""

    name: str
    storage: torch.UntypedStorage
    role: Role
    quantized: bool = False  # a kept-quantized weight's


def sleep_parts(
    model: DecoderModel, companions: tuple[nn.Module, ...] = (), *, skip_fixed: bool = False
) -> list[Held]:
    """Every storage the model and `companions` own (each once, the model's first); a
    ValueError naming a tensor whose storage torch cannot resize (nothing freed then), or
    with `skip_fixed` (a closing runner's) such storages left out."""
    found: dict[int, Held] = {}
    walks = [_module_tensors(model, "", Role.WEIGHTS)]
    walks += [_module_tensors(m, f"draft[{i}].", Role.KEPT) for i, m in enumerate(companions)]
    for walk in walks:
        for name, tensor, role, quantized in walk:
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in found:
                continue
            if not storage.resizable():
                if skip_fixed:
                    continue
                raise ValueError(
                    f"the tensor {name!r} lives in memory torch cannot free (a mapping)"
                )
            found[storage.data_ptr()] = Held(name, storage, role, quantized)
    return list(found.values())


_Found = tuple[str, torch.Tensor, Role, bool]


def _module_tensors(root: nn.Module, prefix: str, role: Role) -> Iterator[_Found]:
    """Parameters (`role`), buffers (KEPT) and the quantized and LoRA projections held as
    plain attributes, of every module under `root`; the model's LoRA slots and hidden rows."""
    for path, module in root.named_modules(prefix=prefix.rstrip(".")):
        dot = f"{path}." if path else ""
        for name, param in module.named_parameters(recurse=False):
            yield f"{dot}{name}", param, role, False
        for name, buffer in module.named_buffers(recurse=False):
            yield f"{dot}{name}", buffer, Role.KEPT, False
        for name, value in vars(module).items():
            if isinstance(value, LoraLinear):
                yield from _projection(f"{dot}{name}.base", value.base, role)
                for tensor in value.device_tensors():
                    yield f"{dot}{name}.slots", tensor, Role.KEPT, False
            elif isinstance(value, Int4Linear | Int8Linear | Fp8Linear):
                yield from _projection(f"{dot}{name}", value, role)
        if isinstance(module, DecoderModel):
            if module.lora is not None:
                for tensor in module.lora.slots.device_tensors():
                    yield f"{dot}lora.slots", tensor, Role.KEPT, False
            if module.target_hidden is not None:
                yield f"{dot}target_hidden", module.target_hidden.buffer, Role.ZEROED, False


def _projection(
    name: str, weight: torch.Tensor | Int4Linear | Int8Linear | Fp8Linear, role: Role
) -> Iterator[_Found]:
    if isinstance(weight, torch.Tensor):
        yield name, weight, role, False
        return
    for tensor in weight.device_tensors():
        yield name, tensor, role, True
