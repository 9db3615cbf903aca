"""A GGUF container reader: metadata and tensor directory, with `struct` and a memory map.

Shared by the tokenizer (metadata only) and the weight loader (tensors). The `gguf` package's
reader wraps every array element of the metadata in numpy views, which takes ~10 s for a
49k-token vocabulary; this walks the same bytes in ~0.1 s. Layout (little-endian, GGUF v2/v3):

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64 | kv_count * (key, type, value)
    | tensor_count * (name, n_dims u32, dims u64 * n_dims, ggml type u32, offset u64)
    | padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
    key/name = u64 length + utf-8 bytes
    value    = scalar | string (u64 length + bytes) | array (elem type u32, count u64, elems)
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MetadataValue = int | float | bool | str | bytes | list["MetadataValue"]

# GGUF value type -> struct format of one scalar element.
_SCALARS: dict[int, str] = {
    0: "<B",  # UINT8
    1: "<b",  # INT8
    2: "<H",  # UINT16
    3: "<h",  # INT16
    4: "<I",  # UINT32
    5: "<i",  # INT32
    6: "<f",  # FLOAT32
    7: "<?",  # BOOL
    10: "<Q",  # UINT64
    11: "<q",  # INT64
    12: "<d",  # FLOAT64
}
_STRING = 8
_ARRAY = 9


class GGUFFormatError(ValueError):
    """The file is not a readable GGUF file; the message names the file."""


def read_gguf_metadata(path: Path) -> dict[str, MetadataValue]:
    """All metadata keys of the GGUF file at `path`. Strings come back as `str` when they are
    valid UTF-8, else as `bytes` (token texts are not guaranteed to be valid UTF-8)."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Parser(buf, path).parse()
    except (struct.error, IndexError) as exc:
        raise GGUFFormatError(f"{path}: truncated or corrupt GGUF metadata ({exc})") from exc
    except ValueError as exc:  # mmap of an empty file
        if isinstance(exc, GGUFFormatError):
            raise
        raise GGUFFormatError(f"{path}: not a GGUF file ({exc})") from exc


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF stores dims fastest-first; reversed here)
    ggml_type: int
    offset: int  # absolute byte offset in the file


def read_gguf_tensor_infos(path: Path) -> tuple[dict[str, MetadataValue], list[TensorInfo]]:
    """Metadata and the tensor directory (names, shapes, types, absolute data offsets)."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            parser = _Parser(buf, path)
            metadata = parser.parse()
            return metadata, parser.tensor_infos(metadata)
    except (struct.error, IndexError) as exc:
        raise GGUFFormatError(f"{path}: truncated or corrupt GGUF header ({exc})") from exc
    except ValueError as exc:
        if isinstance(exc, GGUFFormatError):
            raise
        raise GGUFFormatError(f"{path}: not a GGUF file ({exc})") from exc


def tensor_bytes(path: Path, info: TensorInfo, num_bytes: int) -> np.ndarray:
    """The raw bytes of one tensor, memory-mapped read-only (uint8)."""
    return np.memmap(path, dtype=np.uint8, mode="r", offset=info.offset, shape=(num_bytes,))


_U64 = struct.Struct("<Q")


class _Parser:
    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self._data = data
        self._pos = 0
        self._path = path

    def parse(self) -> dict[str, MetadataValue]:
        if self._data[:4] != b"GGUF":
            raise GGUFFormatError(f"{self._path}: not a GGUF file (bad magic {self._data[:4]!r})")
        self._pos = 4
        version = self._unpack("<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"{self._path}: unsupported GGUF version {version} (need 2 or 3)")
        self._num_tensors = self._unpack("<Q")
        num_kv = self._unpack("<Q")
        metadata: dict[str, MetadataValue] = {}
        for _ in range(num_kv):
            key = self._string()
            value_type = self._unpack("<I")
            metadata[key if isinstance(key, str) else key.decode("utf-8", "replace")] = self._value(
                value_type
            )
        return metadata

    def tensor_infos(self, metadata: dict[str, MetadataValue]) -> list[TensorInfo]:
        """The tensor directory, read after `parse()` left off."""
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(self._num_tensors):
            name = self._string()
            num_dims = self._unpack("<I")
            dims = struct.unpack_from(f"<{num_dims}Q", self._data, self._pos)
            self._pos += 8 * num_dims
            ggml_type = self._unpack("<I")
            offset = self._unpack("<Q")
            text = name if isinstance(name, str) else name.decode("utf-8", "replace")
            raw.append((text, tuple(int(d) for d in reversed(dims)), ggml_type, offset))
        alignment = metadata.get("general.alignment", 32)
        assert isinstance(alignment, int)
        start = -(-self._pos // alignment) * alignment
        return [TensorInfo(n, shape, t, start + off) for n, shape, t, off in raw]

    def _unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self._data, self._pos)
        self._pos += struct.calcsize(fmt)
        return int(value)

    def _string(self) -> str | bytes:
        length = self._unpack("<Q")
        raw = self._data[self._pos : self._pos + length]
        if len(raw) != length:
            raise GGUFFormatError(f"{self._path}: string runs past the end of the metadata")
        self._pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw

    def _strings(self, count: int) -> list[MetadataValue]:
        data, pos = self._data, self._pos
        out: list[MetadataValue] = []
        length_of = _U64.unpack_from
        for _ in range(count):
            (length,) = length_of(data, pos)
            raw = data[pos + 8 : pos + 8 + length]
            if len(raw) != length:
                raise GGUFFormatError(f"{self._path}: string runs past the end of the metadata")
            pos += 8 + length
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(raw)
        self._pos = pos
        return out

    def _value(self, value_type: int) -> MetadataValue:
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            elem_type = self._unpack("<I")
            count = self._unpack("<Q")
            if elem_type in _SCALARS:
                fmt = _SCALARS[elem_type]
                size = struct.calcsize(fmt)
                values = struct.unpack_from(f"<{count}{fmt[1]}", self._data, self._pos)
                self._pos += size * count
                return list(values)
            if elem_type == _STRING:  # vocabularies and merges: ~100k strings, one tight loop
                return self._strings(count)
            return [self._value(elem_type) for _ in range(count)]
        scalar_fmt = _SCALARS.get(value_type)
        if scalar_fmt is None:
            raise GGUFFormatError(f"{self._path}: unknown GGUF value type {value_type}")
        (value,) = struct.unpack_from(scalar_fmt, self._data, self._pos)
        self._pos += struct.calcsize(scalar_fmt)
        result: MetadataValue = value
        return result
