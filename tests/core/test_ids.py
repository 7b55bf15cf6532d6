from __future__ import annotations

import uuid

from reef.core.ids import id_timestamp_ms, new_id


def test_ids_are_uuid7_and_strictly_increasing() -> None:
    ids = [new_id() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122


def test_timestamp_round_trip() -> None:
    import time

    before = time.time_ns() // 1_000_000
    value = new_id()
    after = time.time_ns() // 1_000_000
    assert before <= id_timestamp_ms(value) <= after + 1
