"""UUIDv7 ids: time-ordered, so ids sort by creation and index well.

The random bits come from the OS CSPRNG (``os.urandom``), never from the ``random``
module: record ids are receipts and response ids are the only handle on a stored
conversation, so they must not be predictable from ids a caller has already seen (a
Mersenne Twister's state can be rebuilt from its outputs). One ``getrandom`` call costs
about half a microsecond, small beside the rest of a request; it keeps no state, so a
forked child cannot replay its parent's sequence.
"""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_seq = 0
RANDOM_BITS = 62


def random_bits() -> int:
    """62 bits from the OS CSPRNG: the random part of an id."""
    return int.from_bytes(os.urandom(8), "big") >> (64 - RANDOM_BITS)


def new_id() -> str:
    """Return a new UUIDv7 as a canonical lowercase string.

    Within one millisecond a 12-bit counter keeps ids from one process strictly
    increasing; the remaining 62 bits are random (``random_bits``).
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
    rand = random_bits()
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def id_timestamp_ms(uuid7: str) -> int:
    """Milliseconds since the epoch encoded in a UUIDv7 string."""
    return int(uuid7.replace("-", "")[:12], 16)
