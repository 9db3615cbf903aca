"""A completion's `prompt_embeds` (vLLM's): base64 of a tensor saved by `torch.save`, read into
PromptEmbeds without torch (the server's process never loads it) and without unpickling
anything but a tensor.

    base64 ─► zip (torch.save's archive) ─► <name>/data.pkl: the tensor's storage key, dtype,
                                             offset, size and stride (a restricted unpickler:
                                             only torch's tensor and storage names resolve)
                                            <name>/data/<key>: the storage's raw bytes
           ─► numpy view by size and stride ─► C-order rows [seq_len, hidden_size]

The decoded payload is bounded before it is read: every archive member's declared size (a
compressed member could expand past its bytes in the body) must stay within the body's own
limit, `max_body_bytes`, and so must the rows it makes (an expanded tensor's stride of 0
repeats a few stored values into any number of rows). float32, float16 and bfloat16 travel as they are, float64 as float32;
a [1, seq_len, hidden_size] tensor loses its leading 1 (as vLLM squeezes it). Everything else
about the shape (rank 2, the model's hidden size, max_model_len) is the engine's to check.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from troupe.gateway.errors import ApiError, invalid
from troupe.messages import PromptEmbeds

# torch's storage classes by name -> (dtype name, numpy view type); bfloat16 as raw uint16
_STORAGES = {
    "FloatStorage": ("float32", np.float32),
    "HalfStorage": ("float16", np.float16),
    "BFloat16Storage": ("bfloat16", np.uint16),
    "DoubleStorage": ("float64", np.float64),
}
_ROW_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 4}  # float64 -> float32
MAX_PICKLE_BYTES = 1 << 16  # a tensor's data.pkl is ~200 bytes


@dataclass(frozen=True)
class _Storage:
    dtype: str
    view: type
    key: str
    numel: int


@dataclass(frozen=True)
class _Tensor:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(storage: _Storage, offset: int, size: Any, stride: Any, *_: Any) -> _Tensor:
    return _Tensor(storage, int(offset), tuple(size), tuple(stride))


def _rebuild_parameter(data: _Tensor, *_: Any) -> _Tensor:
    return data


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name


class _TensorUnpickler(pickle.Unpickler):
    """Resolves only the names a saved tensor's pickle holds; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not a float tensor")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError("it holds a storage reference of an unknown form")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType):
            raise pickle.UnpicklingError(f"its storage type {kind!r} is not a float type")
        dtype, view = _STORAGES[kind.name]
        return _Storage(dtype, view, str(key), int(numel))


def decode_prompt_embeds(text: str, field: str, *, max_bytes: int) -> PromptEmbeds:
    """One `prompt_embeds` entry; ApiError(400) naming `field` when it is no float tensor
    saved by torch.save, or (413) when it decodes past `max_bytes`."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(field, f"{field} must be base64 (of a tensor saved by torch.save)") from None
    try:
        tensor, data = _read_archive(raw, field, max_bytes)
        return _rows(tensor, data, field, max_bytes)
    except ApiError:
        raise
    except (zipfile.BadZipFile, KeyError, EOFError, ValueError, TypeError) as exc:
        raise invalid(
            field, f"{field} is not a tensor saved by torch.save: {type(exc).__name__}: {exc}"
        ) from None
    except pickle.UnpicklingError as exc:
        raise invalid(field, f"{field} is not a tensor saved by torch.save: {exc}") from None


def _read_archive(raw: bytes, field: str, max_bytes: int) -> tuple[_Tensor, bytes]:
    archive = zipfile.ZipFile(io.BytesIO(raw))
    members = archive.infolist()
    total = sum(m.file_size for m in members)
    if total > max_bytes:
        raise ApiError(
            413,
            f"{field} decodes to {total} bytes, past max_body_bytes = {max_bytes}",
            param=field,
        )
    pkl = next((m for m in members if m.filename.endswith("/data.pkl")), None)
    if pkl is None or pkl.file_size > MAX_PICKLE_BYTES:
        raise ValueError("no tensor record (data.pkl) of a plausible size")
    root = pkl.filename[: -len("data.pkl")]
    order = next((m for m in members if m.filename == root + "byteorder"), None)
    if order is not None and archive.read(order) != b"little":
        raise ValueError("the tensor was saved big-endian")
    tensor = _TensorUnpickler(io.BytesIO(archive.read(pkl))).load()
    if not isinstance(tensor, _Tensor):
        raise ValueError(f"it holds a {type(tensor).__name__}, not a tensor")
    return tensor, archive.read(root + "data/" + tensor.storage.key)


def _rows(tensor: _Tensor, data: bytes, field: str, max_bytes: int) -> PromptEmbeds:
    size, stride = tensor.size, tensor.stride
    if not all(type(n) is int for n in size + stride) or len(size) != len(stride):
        raise ValueError(f"its size {size!r:.80} and stride {stride!r:.80} are not shape tuples")
    if len(size) == 3 and size[0] == 1:  # a batch of one (vLLM squeezes it)
        size, stride = size[1:], stride[1:]
    if len(size) != 2:
        raise invalid(
            field,
            f"{field} must be a [seq_len, hidden_size] tensor (rank 2), got shape {list(size)}",
        )
    storage = tensor.storage
    flat: np.ndarray = np.frombuffer(data, dtype=storage.view)
    if len(flat) < storage.numel or min(size) < 0 or min(stride) < 0 or tensor.offset < 0:
        raise invalid(field, f"{field} is not a consistent tensor (storage, size, stride)")
    last = tensor.offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if min(size) > 0 and last >= storage.numel:
        raise invalid(field, f"{field} is not a consistent tensor (storage, size, stride)")
    # A stride of 0 repeats storage (torch.save keeps an expand()ed view as it is): a few
    # bytes of body could ask for any number of rows, so the rows count against the limit.
    num_bytes = size[0] * size[1] * _ROW_ITEMSIZE[storage.dtype]
    if num_bytes > max_bytes:
        raise ApiError(
            413,
            f"{field} holds {size[0]} x {size[1]} values ({num_bytes} bytes as rows), past "
            f"max_body_bytes = {max_bytes}",
            param=field,
        )
    itemsize = flat.itemsize
    rows = np.lib.stride_tricks.as_strided(
        flat[tensor.offset :] if min(size) > 0 else flat[:0],
        shape=size,
        strides=tuple(s * itemsize for s in stride),
        writeable=False,
    )
    dtype = storage.dtype
    if dtype == "float64":
        rows, dtype = rows.astype(np.float32), "float32"
    return PromptEmbeds(np.ascontiguousarray(rows).tobytes(), size[0], size[1], dtype)


def decoded_embeds(texts: tuple[str, ...], *, max_bytes: int) -> tuple[PromptEmbeds, ...]:
    """A body's prompt_embeds entries, each decoded (errors name `prompt_embeds[i]`, or
    `prompt_embeds` when there is one)."""
    names = prompt_names(len(texts), 0)
    decoded: list[PromptEmbeds] = []
    for text, name in zip(texts, names, strict=True):
        # the entries' rows share the limit: many small archives of repeated rows add up
        left = max_bytes - sum(len(e.data) for e in decoded)
        decoded.append(decode_prompt_embeds(text, name, max_bytes=left))
    return tuple(decoded)


def prompt_names(num_embeds: int, num_texts: int) -> list[str]:
    """What a refused prompt is called: `prompt_embeds[i]` for the rows (run first), then
    `prompt[j]` for the texts and token ids; an index only where the field holds several."""

    def named(field: str, count: int) -> list[str]:
        return [field] if count == 1 else [f"{field}[{i}]" for i in range(count)]

    return named("prompt_embeds", num_embeds) + named("prompt", num_texts)
