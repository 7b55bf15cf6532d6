"""The one nesting limit: what Reef parses from a client it can always write back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from reef.core.jsoncodec import MAX_DEPTH, WRITE_HEADROOM, deeper_than, dumps, loads


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [0, 1, 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 600])
def test_deeper_than_counts_levels_of_arrays_and_objects(depth: int) -> None:
    value = nested(depth)
    assert deeper_than(value) is (depth > MAX_DEPTH)
    assert deeper_than(value, depth) is False
    assert deeper_than(value, max(depth - 1, 0)) is (depth > 0)


def test_deeper_than_looks_at_every_branch() -> None:
    value = {"a": [1, 2, {"b": []}], "c": "x", "d": [[[[nested(MAX_DEPTH - 4)]]]]}
    assert deeper_than(value) is True
    assert deeper_than(value, MAX_DEPTH + 1) is False
    assert deeper_than([[], {}, "x"], 2) is False
    assert deeper_than([[], {}, "x"], 1) is True


def test_a_document_at_the_limit_writes_back_inside_the_headroom() -> None:
    assert WRITE_HEADROOM >= 64  # records, translations and exports wrap a few levels
    accepted = loads(dumps(nested(MAX_DEPTH)))
    wrapped = accepted
    for _ in range(WRITE_HEADROOM):
        wrapped = {"wrapped": wrapped}
    assert loads(dumps(wrapped)) == wrapped


def test_orjson_still_writes_no_deeper_than_the_headroom_assumes() -> None:
    # If orjson ever writes deeper, WRITE_HEADROOM may grow; if it writes less, it must
    # shrink (and MAX_DEPTH with it) or accepted documents could fail to be recorded.
    with pytest.raises(orjson.JSONEncodeError):
        dumps(nested(MAX_DEPTH + WRITE_HEADROOM + 1))
