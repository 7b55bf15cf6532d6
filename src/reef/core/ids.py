"""UUIDv7 ids: time-ordered, so ids sort by creation and index well."""

from __future__ import annotations

import os
import random
import threading
import time

_lock = threading.Lock()
# Ids need uniqueness, not secrecy (they are receipts, never credentials): a PRNG seeded
# from the OS is ~50x cheaper per id than a urandom syscall on the request hot path.
_random = random.Random(os.urandom(32))  # noqa: S311 (seeded or non-secret randomness)
# A forked child must not replay its parent's sequence.
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(32)))
_last_ms = 0
_seq = 0


def new_id() -> str:
    """Return a new UUIDv7 as a canonical lowercase string.

    Within one millisecond a 12-bit counter keeps ids from one process strictly
    increasing; the remaining 62 bits are random.
    """
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _seq += 1
            if _seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _seq = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _seq = 0
        seq = _seq
        rand = _random.getrandbits(62)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def id_timestamp_ms(uuid7: str) -> int:
    """Milliseconds since the epoch encoded in a UUIDv7 string."""
    return int(uuid7.replace("-", "")[:12], 16)
