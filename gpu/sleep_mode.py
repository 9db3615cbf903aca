"""Sleep mode for the real runner (vLLM's --enable-sleep-mode; SGLang's release / resume
memory occupation): every tensor the weights own on the device (vLLM: all that its
CuMemAllocator holds under the "weights" tag) and the KV pools go back to the allocator between
rollouts, and come back on wake_up. What the weights own (gpu/sleep_parts.py): the served
model's parameters, dense or kept-quantized, its buffers (rotary tables), the LoRA slots, the
hidden rows an EAGLE head reads, and a draft model's or EAGLE / MTP head's weights and buffers.

Every tensor keeps its identity: a *storage* is resized to 0 bytes and back (the trick FSDP
uses), so each parameter, each view of it (fused projections' halves, the pool's per-layer K/V
views, a head's share of the target's tensors) and everything holding one stays valid, with the
same shapes; a storage shared by several tensors (tied embeddings) is freed once:

    sleep(1)   the served weights: bytes copied to (pinned) CPU memory, storage resized to 0
    sleep(2)   the served weights: storage resized to 0 (the caller loads new ones after waking
               them); refused, before anything is freed, while kept-quantized weights are
               served (an update copies into dense weights only)
    both       what no reload refills (buffers, the LoRA slots and the adapters in them, a
               draft model or head): copied to the host and resized to 0; the EAGLE hidden
               rows resized to 0; the KV pools (the target's and a draft's or head's) freed,
               contents gone (the prefix cache is reset); CUDA graphs dropped,
               torch.cuda.empty_cache()
    wake_up    "weights": storages back (level 1: the bytes copied back; level 2: the served
               weights uninitialized until update_weights_from_disk / _from_tensors, the rest
               copied back); "kv_cache": the pools back with the same block count (zeroed on
               CUDA, as at start), their fp8 scales zeroed
    awake      CUDA graphs captured again (the draft model's too): a storage that comes back
               lives at a new address, which the old graphs baked in (vLLM keeps addresses
               with a custom allocator instead); the CPU decode's raw-address bindings are
               rebuilt the same way

Not freed: the CPU int8 form's fbgemm packed copy (gpu/quant_linear.Int8Linear, CPU only: an
opaque object torch cannot resize), the adapters' host copies (host memory already).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

import torch
from troupe.gpu.forward_pass import ForwardPass
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.models import DecoderModel
from troupe.gpu.runner_setup import RunnerOptions
from troupe.gpu.sleep_parts import Companion, Held, Role, sleep_parts
from troupe.gpu.sleep_state import SleepRefused, SleepState
from troupe.gpu.weight_update import WeightReload
from troupe.messages.sleep_calls import SleepTag


class _Stored:
    """One storage while it sleeps: its size and, where it comes back with its values, its
    bytes on the host (`keep`); else it comes back zero-filled (`zero`) or uninitialized."""

    def __init__(self, storage: torch.UntypedStorage, *, keep: bool, zero: bool = False) -> None:
        self.storage = storage
        self.nbytes = storage.nbytes()
        self.zero = zero
        self.backup: torch.Tensor | None = None
        if keep:
            pin = storage.device.type == "cuda"
            self.backup = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
            self.backup.copy_(_as_bytes(storage), non_blocking=pin)

    def restore(self) -> None:
        self.storage.resize_(self.nbytes)
        if self.backup is not None:
            _as_bytes(self.storage).copy_(self.backup, non_blocking=True)
        elif self.zero:
            _as_bytes(self.storage).zero_()


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
        companion: Companion | None = None,
    ) -> None:
        """`forward`: the runner's forward pass, whose graphs are captured again on waking;
        `quiesce`: drop the steps launched ahead (gpu/overlap.py) before the memory goes;
        `companion`: the draft model or EAGLE / MTP head, which sleeps with the model."""
        self.model, self.kv, self._options = model, kv, options
        self._forward, self._weights, self._quiesce = forward, weights, quiesce
        self._companion = companion
        self._state = SleepState()
        self._stored: list[_Stored] = []  # what the weights own, asleep
        self._scales: list[_Stored] = []  # the pools' fp8 scales, asleep

    @property
    def sleeping(self) -> tuple[SleepTag, ...]:
        return self._state.sleeping

    @property
    def level(self) -> int:
        return self._state.level

    def parts(self) -> list[Held]:
        """Every storage a sleep frees now, but the KV pools' (gpu/sleep_parts.py)."""
        companion = self._companion
        return sleep_parts(self.model, () if companion is None else companion.sleep_modules())

    def sleep(self, level: int) -> str:
        """SleepRefused, with nothing freed, where a storage cannot be freed or a level-2
        sleep would drop weights no reload can refill."""
        assert not self.sleeping and level in (1, 2), (self.sleeping, level)
        try:
            parts = self.parts()
        except ValueError as exc:
            raise SleepRefused(str(exc)) from exc
        quantized = list(
            dict.fromkeys(h.name for h in parts if h.quantized and h.role is Role.WEIGHTS)
        )
        if level == 2 and quantized:
            names = ", ".join(quantized[:3]) + (", ..." if len(quantized) > 3 else "")
            raise SleepRefused(
                f"level 2 discards the weights for update_weights_from_disk / _from_tensors to "
                f"refill, which copy into dense weights only; {len(quantized)} served weights "
                f"are kept quantized ({names}): sleep at level 1, or serve with quantization "
                "'dequantize'"
            )
        self._quiesce_steps()
        self._stored = [
            _Stored(
                h.storage,
                keep=h.role is Role.KEPT or (h.role is Role.WEIGHTS and level == 1),
                zero=h.role is Role.ZEROED,
            )
            for h in parts
        ]
        self._sync()  # copied out before the memory goes
        self._drop_graphs()
        for stored in self._stored:
            stored.storage.resize_(0)
        num_kv_bytes = self._free_pools()
        self._weights.asleep = f"the weights sleep (level {level}): wake_up(tags=['weights'])"
        self._state.fall_asleep(level)
        self._return_memory()
        mib = {role: 0.0 for role in Role}
        for stored, held in zip(self._stored, parts, strict=True):
            mib[held.role] += stored.nbytes / 2**20
        kept = "copied to CPU memory" if level == 1 else "discarded"
        return (
            f"asleep at level {level}: {mib[Role.WEIGHTS]:.1f} MiB of weights {kept}, "
            f"{mib[Role.KEPT]:.1f} MiB of buffers, adapters and draft weights copied to CPU "
            f"memory, {mib[Role.ZEROED] + num_kv_bytes / 2**20:.1f} MiB of KV cache and "
            "scratch freed"
        )

    def release(self, *, weights: bool) -> None:
        """The runner is closing: every storage the pools own is freed, and with `weights`
        (the runner loaded the model) the model's and its companion's, nothing kept (asleep
        or not), so a closed runner that something still references holds no device memory:
        a second engine in the process sizes its pool from what is free (on an H100 one found
        the first's 71.5 GiB still in use). A model the caller built stays the caller's."""
        self._quiesce_steps()
        self._drop_graphs()
        companion = self._companion
        modules = () if companion is None else companion.sleep_modules()
        for held in sleep_parts(self.model, modules, skip_fixed=True) if weights else ():
            held.storage.resize_(0)
        self._free_pools()
        self._stored, self._scales = [], []  # an asleep runner's host copies too
        self._weights.asleep = "the runner is closed"
        self._return_memory()

    def _quiesce_steps(self) -> None:
        """The steps launched ahead dropped, and nothing queued still reading or writing."""
        for discard in self._quiesce:
            discard()
        self._sync()

    def _drop_graphs(self) -> None:
        """What read the old addresses: the graphs (which hold their pools) and CPU bindings."""
        self._forward.close()
        self._forward.cpu_decode = None
        if self._companion is not None:
            self._companion.drop_graphs()

    def _return_memory(self) -> None:
        if self.model.device.type == "cuda":
            gc.collect()  # graphs dropped in a reference cycle hold their pools until then
            torch.cuda.empty_cache()

    def wake_up(self, tags: tuple[SleepTag, ...]) -> str:
        assert set(tags) <= set(self.sleeping), (tags, self.sleeping)
        done = []
        if SleepTag.WEIGHTS in tags:
            for stored in self._stored:
                stored.restore()
            self._sync()  # copied back before the host copies go
            self._stored = []
            self._weights.asleep = None
            level_2 = "weights allocated (empty), buffers, adapters and draft restored"
            done.append("weights restored" if self.level == 1 else level_2)
        if SleepTag.KV_CACHE in tags:
            for kv in self._pools():
                kv.reallocate()
            for stored in self._scales:
                stored.restore()
            self._scales = []
            done.append(f"KV cache allocated ({self.kv.num_gpu_blocks} blocks)")
        if self._state.wake(tags):
            self._capture()
            done.append("graphs captured")
        return "; ".join(done)

    def _pools(self) -> list[KVCache]:
        companion = self._companion
        return [self.kv] if companion is None else [self.kv, companion.kv]

    def _free_pools(self) -> int:
        """Every pool freed, and its fp8 scales (zeroed when they come back); the bytes."""
        num_bytes = 0
        for kv in self._pools():
            if kv.scales is not None and kv.scales.untyped_storage().nbytes():
                stored = _Stored(kv.scales.untyped_storage(), keep=False, zero=True)
                stored.storage.resize_(0)
                self._scales.append(stored)
            num_bytes += kv.free()
        return num_bytes

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
        if self._companion is not None:
            self._companion.capture_graphs()
        self._sync()

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
