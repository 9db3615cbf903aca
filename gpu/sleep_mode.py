"""Sleep mode for the real runner (vLLM's --enable-sleep-mode; SGLang's release / resume
memory occupation): the device memory of the weights and the KV pools goes back to the allocator
between rollouts, and comes back on wake_up.

Every tensor keeps its identity: a weight's or the pool's *storage* is resized to 0 bytes and
back (the trick FSDP uses), so each parameter, each view of it (fused projections' halves, the
pool's per-layer K/V views) and everything holding one stays valid, with the same shapes:

    sleep(1)   weights: bytes copied to (pinned) CPU memory, storage resized to 0
    sleep(2)   weights: storage resized to 0 (the caller loads new ones after waking them)
    both       KV pool and CPU swap pool freed (contents gone: the prefix cache is reset),
               CUDA graphs dropped, torch.cuda.empty_cache()
    wake_up    "weights": storage back (level 1: the bytes copied back; level 2: uninitialized
               until update_weights_from_disk / _from_tensors); "kv_cache": the pool back with
               the same block count (zeroed on CUDA, as at start)
    awake      CUDA graphs captured again: a storage that comes back lives at a new address,
               which the old graphs baked in (vLLM keeps addresses with a custom allocator
               instead); the CPU decode's raw-address bindings are rebuilt the same way

Not moved (they stay on the device): buffers (rotary tables), kept-quantized weights (4-bit,
fp8), LoRA-wrapped projections' bases and adapter slots, a draft model or EAGLE head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.models import DecoderModel
from troupe.gpu.runner_setup import RunnerOptions
from troupe.gpu.sleep_state import SleepState
from troupe.gpu.weight_update import WeightReload
from troupe.messages.sleep_calls import SleepTag


class _Stored:
    """One weight storage while it sleeps: its size and (level 1) its bytes on the host."""

    def __init__(self, storage: torch.UntypedStorage, keep: bool) -> None:
        self.storage = storage
        self.nbytes = storage.nbytes()
        self.backup: torch.Tensor | None = None
        if keep:
            pin = storage.device.type == "cuda"
            self.backup = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
            self.backup.copy_(_as_bytes(storage), non_blocking=pin)

    def restore(self) -> None:
        self.storage.resize_(self.nbytes)
        if self.backup is not None:
            _as_bytes(self.storage).copy_(self.backup, non_blocking=True)


class ModelSleeper:
    """The ModelRunner's gpu.runner.Sleeper."""

    def __init__(
        self,
        model: DecoderModel,
        kv: KVCache,
        options: RunnerOptions,
        forward: ForwardPass,
        weights: WeightReload,
        quiesce: Sequence[Callable[[], None]],
    ) -> None:
        """`forward`: the runner's forward pass, whose graphs are captured again on waking;
        `quiesce`: drop the steps launched ahead (gpu/overlap.py) before the memory goes."""
        self.model, self.kv, self._options = model, kv, options
        self._forward, self._weights, self._quiesce = forward, weights, quiesce
        self._state = SleepState()
        self._stored: list[_Stored] = []

    @property
    def sleeping(self) -> tuple[SleepTag, ...]:
        return self._state.sleeping

    @property
    def level(self) -> int:
        return self._state.level

    def sleep(self, level: int) -> str:
        assert not self.sleeping and level in (1, 2), (self.sleeping, level)
        for discard in self._quiesce:
            discard()
        storages = weight_storages(self.model)
        self._sync()
        self._stored = [_Stored(s, keep=level == 1) for s in storages]
        self._sync()  # copied out before the memory goes
        self._forward.close()  # its graphs read the old addresses (and hold their pools)
        self._forward.cpu_decode = None
        for stored in self._stored:
            stored.storage.resize_(0)
        num_kv_bytes = self.kv.free()
        self._weights.asleep = f"the weights sleep (level {level}): wake_up(tags=['weights'])"
        self._state.fall_asleep(level)
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()
        num_weight_bytes = sum(s.nbytes for s in self._stored)
        kept = "copied to CPU memory" if level == 1 else "discarded"
        return (
            f"asleep at level {level}: {num_weight_bytes / 2**20:.1f} MiB of weights {kept}, "
            f"{num_kv_bytes / 2**20:.1f} MiB of KV cache freed"
        )

    def wake_up(self, tags: tuple[SleepTag, ...]) -> str:
        assert set(tags) <= set(self.sleeping), (tags, self.sleeping)
        done = []
        if SleepTag.WEIGHTS in tags:
            for stored in self._stored:
                stored.restore()
            self._sync()  # copied back before the host copies go
            self._stored = []
            self._weights.asleep = None
            done.append("weights restored" if self.level == 1 else "weights allocated (empty)")
        if SleepTag.KV_CACHE in tags:
            self.kv.reallocate()
            done.append(f"KV cache allocated ({self.kv.num_gpu_blocks} blocks)")
        if self._state.wake(tags):
            self._capture()
            done.append("graphs captured")
        return "; ".join(done)

    def _capture(self) -> None:
        """The forward's graphs and CPU bindings again, over the storages' new addresses."""
        fresh = ForwardPass.for_options(self.model, self.kv, self._options)
        forward = self._forward
        forward.graphs, forward.mixed, forward.cpu_decode = (
            fresh.graphs,
            fresh.mixed,
            fresh.cpu_decode,
        )
        self.kv.reset_scales()  # the captures wrote made-up KV (as at start)
        self._sync()

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)


def weight_storages(model: DecoderModel) -> list[torch.UntypedStorage]:
    """The storages of the model's parameters, each once (tied embeddings share one); a
    ValueError naming a parameter whose storage cannot be resized (nothing freed then)."""
    seen: dict[int, torch.UntypedStorage] = {}
    for name, param in model.named_parameters():
        storage = param.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        if not storage.resizable():
            raise ValueError(f"the weight {name!r} lives in memory torch cannot free (a mapping)")
        seen[storage.data_ptr()] = storage
    return list(seen.values())


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
