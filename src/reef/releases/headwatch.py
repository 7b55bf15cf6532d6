"""Noticing head moves: polling ``heads`` and, on PostgreSQL, ``LISTEN reef_heads``.

The chain sends ``NOTIFY reef_heads, '<scenario>'`` inside every transaction that moves
a head, so listeners hear it exactly when the move commits. Notifications are a hint
only (lost while a listener reconnects, skipped for absurdly long scenario names): the
poll of ``ReleaseChain.heads_snapshot`` is what makes watching correct; a notification
only makes it prompt. Both helpers block; run them in a thread. Given a ``listening``
event, they set it once ``LISTEN`` is in effect (a move committed after that is heard)
and clear it while the connection is being re-established.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.engine import make_url

from reef.core.errors import InvalidInputError, ReefError, optional_dependency

HEADS_CHANNEL = "reef_heads"
# PostgreSQL refuses payloads of 8000 bytes or more.
MAX_NOTIFY_PAYLOAD = 7999

log = logging.getLogger(__name__)

HeadsSnapshot = dict[str, tuple[str, int]]


def _libpq_url(url: str) -> str:
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise InvalidInputError(f"LISTEN needs a postgresql:// store URL, not {url!r}")
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def listen_heads(
    url: str,
    callback: Callable[[str], None],
    stop_event: threading.Event,
    poll_seconds: float = 0.5,
    listening: threading.Event | None = None,
) -> None:
    """Call ``callback(scenario)`` for every head move announced on PostgreSQL until
    ``stop_event`` is set (noticed within ``poll_seconds``). Reconnects after a lost
    connection. ``listening`` is set while ``LISTEN`` is in effect. Needs psycopg (the
    ``postgres`` extra); raises ``InvalidInputError`` for a non-PostgreSQL URL.
    """
    with optional_dependency("postgres", "following heads on PostgreSQL"):
        import psycopg

    conninfo = _libpq_url(url)
    if listening is None:
        listening = threading.Event()
    try:
        while not stop_event.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {HEADS_CHANNEL}")  # autocommit: in effect now
                    listening.set()
                    while not stop_event.is_set():
                        for notice in conn.notifies(timeout=poll_seconds):
                            callback(notice.payload)
            except psycopg.OperationalError as error:
                listening.clear()
                log.warning(
                    "LISTEN %s lost its connection (%s); reconnecting", HEADS_CHANNEL, error
                )
                stop_event.wait(1.0)
    finally:
        listening.clear()


def _pause(seconds: float, wake: threading.Event, stop_event: threading.Event) -> None:
    """Wait ``seconds``, ending early on ``wake`` or (within 0.1 s) on ``stop_event``."""
    deadline = time.monotonic() + seconds
    while not stop_event.is_set():
        left = deadline - time.monotonic()
        if left <= 0 or wake.wait(min(left, 0.1)):
            return


def watch_heads(
    snapshot: Callable[[], HeadsSnapshot],
    on_change: Callable[[str, str, int], None],
    stop_event: threading.Event,
    interval_seconds: float = 0.5,
    listen_url: str | None = None,
    listening: threading.Event | None = None,
) -> None:
    """Call ``on_change(scenario, release_id, seq)`` for every head present at start and
    for every later move, until ``stop_event`` is set.

    ``snapshot`` is usually ``ReleaseChain.heads_snapshot``, polled every
    ``interval_seconds``; with ``listen_url`` (PostgreSQL) a notification wakes the
    poll at once, and ``listening`` is set while the listener's ``LISTEN`` is in effect.
    ``stop_event`` is noticed within 0.1 s. A failing poll (``ReefError``,
    e.g. the store is down) is logged and retried at the next interval; exceptions from
    ``on_change`` propagate.
    """
    wake = threading.Event()
    # The listener's own stop: it must end when this function does, even on an error.
    listener_stop = threading.Event()
    listener: threading.Thread | None = None
    if listen_url is not None:
        listener = threading.Thread(
            target=listen_heads,
            args=(listen_url, lambda _scenario: wake.set(), listener_stop),
            kwargs={"listening": listening},
            name="reef-listen-heads",
            daemon=True,
        )
        listener.start()
    seen: HeadsSnapshot = {}
    try:
        while not stop_event.is_set():
            wake.clear()  # before the poll: a move announced during it wakes the next one
            try:
                current = snapshot()
            except ReefError as error:
                log.warning("polling release heads failed: %s", error.message)
                current = seen
            for scenario, (release_id, seq) in sorted(current.items()):
                if seen.get(scenario) != (release_id, seq):
                    on_change(scenario, release_id, seq)
            seen = current
            _pause(interval_seconds, wake, stop_event)
    finally:
        listener_stop.set()
        if listener is not None:
            listener.join(timeout=5)
