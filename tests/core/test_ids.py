from __future__ import annotations

import os
import random
import time
import uuid

import pytest

from reef.core.ids import RANDOM_BITS, id_timestamp_ms, new_id

_RANDOM_MASK = (1 << RANDOM_BITS) - 1


def _random_part(value: str) -> int:
    return uuid.UUID(value).int & _RANDOM_MASK


def test_ids_are_uuid7_and_strictly_increasing() -> None:
    ids = [new_id() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for value in (ids[0], ids[-1]):
        parsed = uuid.UUID(value)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122


def test_timestamp_round_trip() -> None:
    before = time.time_ns() // 1_000_000
    value = new_id()
    after = time.time_ns() // 1_000_000
    assert before <= id_timestamp_ms(value) <= after + 1


def test_the_random_bits_come_from_the_os_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\xff" * n)
    assert _random_part(new_id()) == _RANDOM_MASK
    monkeypatch.setattr(os, "urandom", lambda n: b"\x00" * n)
    zero = uuid.UUID(new_id())
    assert zero.int & _RANDOM_MASK == 0
    assert zero.version == 7 and zero.variant == uuid.RFC_4122  # the layout bits stay


def test_ids_do_not_come_from_the_random_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Mersenne Twister's state can be rebuilt from its outputs, so ids drawn from one
    are guessable: seeding ``random`` must change nothing, and ids need none of it."""
    random.seed(1234)
    first = new_id()
    random.seed(1234)
    second = new_id()
    assert _random_part(first) != _random_part(second)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an id drew on the random module")

    for name in ("getrandbits", "random", "randbytes", "_randbelow"):
        monkeypatch.setattr(random.Random, name, refuse)
    monkeypatch.setattr(random, "getrandbits", refuse)
    assert uuid.UUID(new_id()).version == 7


def test_every_random_bit_varies() -> None:
    parts = [_random_part(new_id()) for _ in range(4000)]
    assert len(set(parts)) == len(parts)
    for bit in range(RANDOM_BITS):
        ones = sum(part >> bit & 1 for part in parts)
        assert 1400 < ones < 2600, f"bit {bit} was set in {ones} of 4000 ids"
