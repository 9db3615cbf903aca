"""CanonicalJson: the written text of a JSON value, fed as it grows however it is cut, comes
out as json.dumps(ensure_ascii=False) writes the parsed value, and every answer on the way is a
prefix of that text (what went out is never taken back)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from troupe.gateway.json_canonical import CanonicalJson

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


def _written(value: Any, draw: Any) -> str:
    """`value` as a model might write it: its own spacing, and escapes where json.dumps would
    write the character (ensure_ascii=True writes \\u escapes, surrogate pairs included)."""
    space = draw(st.sampled_from(["", " ", "\n  ", "\t"]))
    if isinstance(value, dict):
        members = [
            f"{_written(k, draw)}{space}:{space}{_written(v, draw)}" for k, v in value.items()
        ]
        return "{" + space + f"{space},{space}".join(members) + space + "}"
    if isinstance(value, list):
        return "[" + f",{space}".join(_written(v, draw) for v in value) + "]"
    if isinstance(value, float) and draw(st.booleans()):
        return f"{value:.17e}"  # another spelling of the same number
    return json.dumps(value, ensure_ascii=draw(st.booleans()))


def _feed_in_cuts(written: str, cuts: list[int]) -> list[str]:
    canonical = CanonicalJson()
    return [canonical.feed(written[:cut]) for cut in sorted({*cuts, len(written)})]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_cut_comes_out_as_json_dumps_writes_it(data: st.DataObject) -> None:
    value = data.draw(st.dictionaries(st.text(max_size=5), _VALUES, max_size=4))
    written = _written(value, data.draw)
    cuts = data.draw(st.lists(st.integers(0, len(written)), max_size=12))
    answers = _feed_in_cuts(written, cuts)
    whole = json.dumps(json.loads(written), ensure_ascii=False)
    assert answers[-1] == whole
    assert all(whole.startswith(answer) for answer in answers)


def test_escapes_numbers_and_what_waits() -> None:
    written = '{"a" :"x\\u00e9\\/\\ud83d\\ude00\\n", "b":[1.50 ,true], "c": 1e2}'
    answers = _feed_in_cuts(written, list(range(len(written))))
    assert answers[-1] == '{"a": "xé/😀\\n", "b": [1.5, true], "c": 100.0}'
    canonical = CanonicalJson()
    assert canonical.feed('{"a": 12') == '{"a": '  # the number may go on
    assert canonical.feed('{"a": 123}') == '{"a": 123}'
    canonical = CanonicalJson()
    assert canonical.feed('{"s": "x\\ud83d') == '{"s": "x'  # a surrogate waits for its pair
    assert canonical.feed('{"s": "x\\ud83d\\u') == '{"s": "x'
    assert canonical.feed('{"s": "x\\ud83d\\ude00"}') == '{"s": "x😀"}'


def test_text_that_is_not_json_stops_it() -> None:
    canonical = CanonicalJson()
    assert canonical.feed('{"a": tru') == '{"a": '
    assert canonical.feed('{"a": trux, "b": 1}') == '{"a": '
    assert canonical.is_bad
    assert canonical.feed('{"a": trux, "b": 1} and more') == '{"a": '
    raw = CanonicalJson()
    assert raw.feed('{"a": "line\nbreak"}') == '{"a": "line' and raw.is_bad  # json.loads refuses
