"""New weights for the served model, copied in place (Engine.update_weights_from_disk and
update_weights_from_tensors; SGLang's names, vLLM's reload through collective_rpc).

Every parameter keeps its tensor, so CUDA graphs that captured their addresses replay the new
values, and nothing is allocated on the device. All is checked before anything is copied:

    folder     an HF folder: config.json + safetensors (no GGUF, no fp8 or other quantized
               tensors: the headers are read, not the data)
    config     the served model's ModelConfig, field for field (architecture, shapes, rope,
               torch_dtype): a checkpoint of another model is refused naming the fields
    tensors    read into a model of the same config on the CPU, through the start-up loader
               (gpu/weight_fill.py: names, shapes, every parameter filled, Gemma's norms)
    served     every parameter a dense tensor of the shadow's shape and dtype (kept 4-bit or
               fp8 weights are refused); LoRA-wrapped projections update their base weight

Then each parameter is copied from the shadow (host memory: one copy of the model) into the
served one. The caller (the executor, between steps, with no request running) resets the prefix
cache afterwards: its KV was computed with the old weights. The tokenizer is not reloaded.

From tensors (an RL trainer's, in the engine's process): the engine stages them here under its
call id (`stage`, from the event loop's thread) and the executor's thread takes them
(`from_staged`); they go through the same shadow, so names, shapes and dtypes are checked the
same way, and every weight must be given. Weights asleep (gpu/sleep_mode.py) take no update.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from pathlib import Path

import torch
from troupe.gpu.lora_linear import LoraLinear
from troupe.gpu.model_config import ModelConfig, ModelLoadError
from troupe.gpu.models import DecoderModel
from troupe.gpu.runner import WeightsRefused
from troupe.gpu.weights import build_model, iter_hf_tensors, safetensors_files
from troupe.messages.engine_calls import WeightsErrorCode

PLAIN_DTYPES = ("F32", "F16", "BF16")  # safetensors' names of the dtypes copied as they are
_PLAIN_TORCH = (torch.float32, torch.float16, torch.bfloat16)  # ... and torch's
_SHADOW_POSITIONS = 8  # the shadow never runs: its rotary table needs no length


class WeightReload:
    """Replaces the weights of `model` (whose shapes `config` gives) from checkpoints on disk."""

    def __init__(self, model: DecoderModel, config: ModelConfig) -> None:
        self.model = model
        self.config = config
        self.asleep: str | None = None  # why no update is taken now (gpu/sleep_mode.py)
        self._staged: dict[int, list[tuple[str, torch.Tensor]]] = {}
        self._lock = threading.Lock()  # staged on the event loop, taken by the executor

    def from_disk(self, path: str) -> str:
        """Copy the checkpoint in folder `path` into the model; what was copied. Raises
        WeightsRefused naming what does not match, with nothing copied."""
        self._check_awake()
        folder = Path(path)
        return self._copy(self._read(folder), str(folder))

    def stage(self, call_id: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Keep HF-named tensors for update call `call_id` (from_staged takes them)."""
        with self._lock:
            self._staged[call_id] = list(named_tensors)

    def unstage(self, call_id: int) -> None:
        """Forget what call `call_id` staged (it ended, or never reached the executor)."""
        with self._lock:
            self._staged.pop(call_id, None)

    def from_staged(self, call_id: int) -> str:
        """Copy the tensors staged for `call_id` into the model, checked as from_disk's."""
        with self._lock:
            named = self._staged.pop(call_id, None)
        if named is None:
            raise WeightsRefused(f"no tensors were staged for update {call_id}")
        self._check_awake()
        for name, tensor in named:
            if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _PLAIN_TORCH:
                what = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise WeightsRefused(
                    f"tensor {name!r} is {what}; an update takes float32, float16 or bfloat16 "
                    "tensors only"
                )
        source = f"{len(named)} tensors"
        cpu = ((name, t.detach().to("cpu")) for name, t in named)
        try:
            shadow = build_model(
                self.config, cpu, self.model.dtype, torch.device("cpu"), _SHADOW_POSITIONS, source
            )
        except ModelLoadError as exc:
            raise WeightsRefused(f"named_tensors: {exc}") from exc
        return self._copy(shadow, source)

    def _check_awake(self) -> None:
        if self.asleep is not None:
            raise WeightsRefused(self.asleep, WeightsErrorCode.UNSUPPORTED)

    def _copy(self, shadow: DecoderModel, source: str) -> str:
        pairs = self._pair(shadow)
        num_bytes = 0
        with torch.inference_mode():
            for served, new in pairs:
                served.copy_(new)
                num_bytes += served.numel() * served.element_size()
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)  # copied before the shadow is freed
        return f"copied {len(pairs)} tensors ({num_bytes / 2**20:.1f} MiB) from {source}"

    def _read(self, folder: Path) -> DecoderModel:
        if not folder.is_dir():
            raise WeightsRefused(
                f"model_path {str(folder)!r} is not a folder; an update reads an HF checkpoint "
                "(config.json and safetensors) of the served model's architecture"
            )
        try:
            config = ModelConfig.from_hf_folder(folder)
            check_plain_tensors(safetensors_files(folder))
        except ModelLoadError as exc:
            raise WeightsRefused(f"model_path: {exc}") from exc
        if differences := config_differences(self.config, config):
            raise WeightsRefused(
                f"model_path {str(folder)!r} is not a checkpoint of the served model: "
                f"{differences} (served != checkpoint)"
            )
        try:
            return build_model(
                config,
                iter_hf_tensors(folder),
                self.model.dtype,
                torch.device("cpu"),
                _SHADOW_POSITIONS,
                str(folder),
            )
        except ModelLoadError as exc:
            raise WeightsRefused(f"model_path: {exc}") from exc

    def _pair(self, shadow: DecoderModel) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(served tensor, new values) for every parameter; refused before any copy."""
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, new in shadow.named_parameters():
            served = _attribute(self.model, name)
            if isinstance(served, LoraLinear):  # the adapters sit on top: update their base
                served = served.base
            if not isinstance(served, torch.Tensor):
                raise WeightsRefused(
                    f"the served weight {name!r} is quantized ({type(served).__name__}): an "
                    "update copies into dense weights only (serve with quantization "
                    "'dequantize')",
                    WeightsErrorCode.UNSUPPORTED,
                )
            if served.shape != new.shape or served.dtype != new.dtype:
                raise WeightsRefused(
                    f"{name}: the checkpoint gives {tuple(new.shape)} {new.dtype}, the served "
                    f"weight is {tuple(served.shape)} {served.dtype}"
                )
            pairs.append((served, new))
        return pairs


def config_differences(served: ModelConfig, new: ModelConfig) -> str:
    """The fields in which two configs differ, as 'field: served != new' ('' when equal)."""
    parts = []
    for field in dataclasses.fields(ModelConfig):
        old_value, new_value = getattr(served, field.name), getattr(new, field.name)
        if old_value != new_value:
            parts.append(f"{field.name}: {old_value!r} != {new_value!r}")
    return "; ".join(parts)


def check_plain_tensors(files: list[Path]) -> None:
    """ModelLoadError naming the first tensor whose dtype is not a plain float (fp8 and other
    quantized checkpoints): only their headers are read."""
    from safetensors import SafetensorError, safe_open

    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    dtype = handle.get_slice(name).get_dtype()
                    if dtype not in PLAIN_DTYPES:
                        raise ModelLoadError(
                            f"{file}: tensor {name!r} is {dtype}; an update takes "
                            f"{', '.join(PLAIN_DTYPES)} tensors only (no quantized checkpoints)"
                        )
        except SafetensorError as exc:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({exc})") from exc


def _attribute(model: DecoderModel, name: str) -> object:
    """The served model's attribute at a dotted parameter name (a LoRA wrapper or a quantized
    weight where the plain model has a parameter)."""
    owner: object = model
    for part in name.split("."):
        owner = getattr(owner, part)
    return owner
