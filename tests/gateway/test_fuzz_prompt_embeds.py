"""Fuzz the `prompt_embeds` reader (gateway/prompt_embeds_body.py) with torch.save archives of
every shape a pickle can claim: sizes and strides negative, zero, huge, of different lengths or
not ints; offsets and storage sizes that do not fit the bytes; every float storage type.

Property: decode_prompt_embeds returns rows that are exactly what the tensor holds and fit
the limit, or raises ApiError (400, or 413 past the limit) naming the field; nothing else
escapes (an escape was a 500), and no payload makes more bytes than the limit allows (an
expanded tensor's stride 0 did: a 2 kB body asked for 1.6 GB of rows).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zipfile
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from troupe.gateway.errors import ApiError
from troupe.gateway.prompt_embeds_body import decode_prompt_embeds, decoded_embeds

from tests.gateway.fuzz_bodies import FUZZ, post
from tests.gateway.test_fuzz_openai_http import srv  # noqa: F401 -- the module's server

LIMIT = 64 * 1024
DECODED: list[int] = []  # the fuzz's decoded tensors' row counts
STORAGES = {
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": np.uint16,
    "DoubleStorage": np.float64,
}


class _Storage:
    def __init__(self, kind: str, numel: int) -> None:
        self.kind, self.numel = kind, numel


class _Rebuild:
    def __init__(self, *args: Any) -> None:
        self.args = args


class _Pickler(pickle.Pickler):
    """Writes what torch.save's data.pkl holds, with any arguments at all."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            return ("storage", getattr(torch, obj.kind), "0", "cpu", obj.numel)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _Rebuild):
            return torch._utils._rebuild_tensor_v2, obj.args
        return NotImplemented


def archive(kind: str, numel: int, data: bytes, offset: Any, size: Any, stride: Any) -> str:
    """base64 of a torch.save-shaped zip whose tensor record says what the arguments say."""
    record = io.BytesIO()
    _Pickler(record, protocol=2).dump(_Rebuild(_Storage(kind, numel), offset, size, stride))
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as zf:
        zf.writestr("archive/data.pkl", record.getvalue())
        zf.writestr("archive/byteorder", b"little")
        zf.writestr("archive/data/0", data)
    return base64.b64encode(raw.getvalue()).decode()


DIMS = st.integers(-2, 8) | st.sampled_from([2**31, 2**62, 10**6, 2**64])
SMALL = st.integers(0, 6)
SHAPES = st.one_of(
    st.tuples(SMALL, SMALL),  # most records: rank 2 and small, so many fit their storage
    st.tuples(st.just(1), SMALL, SMALL),
    st.lists(DIMS, min_size=0, max_size=4).map(tuple),
    st.sampled_from([("a", 3), (1.5, 2), (None,), 3, "ab", ((2,), 2), (True, 2)]),
)


@settings(FUZZ, max_examples=60)
@given(
    kind=st.sampled_from(sorted(STORAGES)),
    numel=st.just(40) | st.integers(-1, 40) | st.just(2**40),
    num_values=st.just(40) | st.integers(0, 40),
    offset=st.integers(0, 3) | st.integers(-2, 40) | st.just(2**63),
    size=SHAPES,
    stride=SHAPES,
)
def test_fuzz_tensor_records(
    kind: str, numel: int, num_values: int, offset: int, size: Any, stride: Any
) -> None:
    values = np.arange(num_values).astype(STORAGES[kind])
    text = archive(kind, numel, values.tobytes(), offset, size, stride)
    try:
        rows = decode_prompt_embeds(text, "prompt_embeds[1]", max_bytes=LIMIT)
    except ApiError as exc:
        assert exc.status in (400, 413) and exc.param == "prompt_embeds[1]", exc.message
        return
    DECODED.append(rows.num_rows)
    itemsize = 2 if kind in ("HalfStorage", "BFloat16Storage") else 4
    assert len(rows.data) == rows.num_rows * rows.hidden_size * itemsize <= LIMIT
    if not rows.data:  # no rows (an empty prompt is the engine's to refuse)
        return
    want = torch.as_strided(torch.from_numpy(values.astype(np.float64)), size, stride, offset)
    got = np.frombuffer(rows.data, {2: STORAGES[kind], 4: np.float32}[itemsize])
    if kind == "BFloat16Storage":  # raw bits: compare as stored
        got = got.astype(np.uint16)
    want_values = want.reshape(-1).numpy().astype(got.dtype)
    assert got.tolist() == want_values.tolist()


def test_the_fuzz_decoded_some_tensors() -> None:
    """The property was checked on real rows, not only on refusals."""
    assert len(DECODED) >= 5, DECODED


# -- bugs the fuzz found ------------------------------------------------------------------------


def saved(tensor: torch.Tensor) -> str:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def test_an_expanded_tensor_counts_its_rows_against_the_limit() -> None:
    """Was 1.6 GB allocated for 2 kB of body: torch.save keeps expand()'s stride 0."""
    text = saved(torch.zeros(1).expand(20000, 20000))
    assert len(text) < 4096
    with pytest.raises(ApiError) as info:
        decode_prompt_embeds(text, "prompt_embeds", max_bytes=LIMIT)
    assert info.value.status == 413 and info.value.param == "prompt_embeds"
    assert "20000 x 20000" in info.value.message and str(LIMIT) in info.value.message
    fits = decode_prompt_embeds(saved(torch.ones(1).expand(4, 8)), "p", max_bytes=LIMIT)
    assert (fits.num_rows, fits.hidden_size, len(fits.data)) == (4, 8, 128)


def test_the_entries_of_one_body_share_the_limit() -> None:
    text = saved(torch.ones(1).expand(100, 100))  # 40000 bytes of rows each
    assert len(decoded_embeds((text,), max_bytes=LIMIT)) == 1
    with pytest.raises(ApiError) as info:
        decoded_embeds((text, text), max_bytes=LIMIT)
    assert info.value.status == 413 and info.value.param == "prompt_embeds[1]"


@pytest.mark.parametrize(
    ("size", "stride"), [(("a", 3), (3, 1)), ((2, 3), (3,)), ((2.0, 3), (3, 1)), (5, 1)]
)
def test_a_record_whose_shape_is_not_ints_is_a_400(size: Any, stride: Any) -> None:
    """Were 500s: _rows compared, zipped and strided them outside the reader's error net."""
    text = archive("FloatStorage", 6, bytes(24), 0, size, stride)
    with pytest.raises(ApiError) as info:
        decode_prompt_embeds(text, "prompt_embeds", max_bytes=LIMIT)
    assert info.value.status == 400 and info.value.param == "prompt_embeds"


def test_over_http_an_expanded_tensor_is_a_413(srv: Any) -> None:  # noqa: F811
    import anyio

    body = {"prompt_embeds": saved(torch.zeros(1).expand(20000, 20000)), "max_tokens": 1}

    async def run() -> tuple[int, Any]:
        return await post(srv.url + "/v1/completions", json.dumps(body).encode())

    status, answer = anyio.run(run)
    assert status == 413, answer
    assert answer["error"]["param"] == "prompt_embeds", answer
