"""Noticing head moves: the poller on both backends, LISTEN/NOTIFY on PostgreSQL."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from reef.core.errors import InvalidInputError
from reef.experience import StoreUnavailableError
from reef.releases import ReleaseChain, ReleaseConflictError, listen_heads, watch_heads
from reef.releases.headwatch import HeadsSnapshot
from tests.releases.conftest import ManifestFactory

Seen = queue.Queue[tuple[str, ...]]


@contextmanager
def running(target: Callable[..., None], *args: object) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(*args, stop), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_watch_heads_reports_existing_heads_then_each_move(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    seen: Seen = queue.Queue()

    def on_change(scenario: str, release_id: str, seq: int) -> None:
        seen.put((scenario, release_id, str(seq)))

    with running(watch_heads, chain.heads_snapshot, on_change):
        assert seen.get(timeout=2) == ("s", root.id, "1")
        other = chain.create("t", manifest(), "config", "init")
        assert seen.get(timeout=2) == ("t", other.id, "1")
        candidate = chain.propose("s", manifest(adapter=1), root.id, "w", "r")
        learned = chain.publish(candidate.id, root.id, "w", "r", require_passed=False)
        assert seen.get(timeout=2) == ("s", learned.id, "2")
    assert seen.empty()


def test_watch_heads_survives_a_failing_poll() -> None:
    calls: list[int] = []
    seen: Seen = queue.Queue()

    def snapshot() -> HeadsSnapshot:
        calls.append(1)
        if len(calls) == 2:
            raise StoreUnavailableError("database is locked")
        return {"s": ("r1", 1)} if len(calls) < 4 else {"s": ("r2", 2)}

    def on_change(scenario: str, release_id: str, seq: int) -> None:
        seen.put((scenario, release_id))

    with running(lambda stop: watch_heads(snapshot, on_change, stop, interval_seconds=0.01)):
        assert seen.get(timeout=2) == ("s", "r1")
        assert seen.get(timeout=2) == ("s", "r2")


@pytest.mark.postgres
def test_listen_heads_hears_every_committed_move(
    pg_url: str, pg_chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    chain = pg_chain
    heard: queue.Queue[str] = queue.Queue()
    listening = threading.Event()
    with running(lambda stop: listen_heads(pg_url, heard.put, stop, listening=listening)):
        assert listening.wait(timeout=10), "the listener never LISTENed"
        root = chain.create("s", manifest(), "config", "init")
        assert heard.get(timeout=2) == "s"
        late = chain.propose("s", manifest(adapter=1), root.id, "w", "r")
        chain.publish(
            chain.propose("s", manifest(adapter=2), root.id, "w", "r").id,
            root.id,
            "w",
            "r",
            require_passed=False,
        )
        assert heard.get(timeout=2) == "s"
        with pytest.raises(ReleaseConflictError):  # nothing moved: nothing announced
            chain.publish(late.id, root.id, "w", "stale", require_passed=False)
        # Notifications arrive in commit order: had the conflict announced anything, it
        # would come before the next move's.
        chain.create("t", manifest(), "config", "init")
        assert heard.get(timeout=2) == "t"
        assert heard.empty()


@pytest.mark.postgres
def test_watch_heads_wakes_on_notify(
    pg_url: str, pg_chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    chain = pg_chain
    seen: Seen = queue.Queue()

    def on_change(scenario: str, release_id: str, seq: int) -> None:
        seen.put((scenario, release_id))

    listening = threading.Event()

    def watch(stop: threading.Event) -> None:
        # A poll interval far beyond the deadline: only a notification can meet it.
        watch_heads(
            chain.heads_snapshot,
            on_change,
            stop,
            interval_seconds=30,
            listen_url=pg_url,
            listening=listening,
        )

    with running(watch):
        assert listening.wait(timeout=10), "the watcher's listener never LISTENed"
        root = chain.create("s", manifest(), "config", "init")
        assert seen.get(timeout=1.5) == ("s", root.id)


@pytest.mark.postgres
def test_listening_is_set_only_while_listen_is_in_effect(pg_url: str) -> None:
    listening = threading.Event()
    with running(lambda stop: listen_heads(pg_url, print, stop, listening=listening)):
        assert listening.wait(timeout=10)
    assert not listening.is_set()  # stopped: nobody listens any more


def test_listen_heads_needs_postgresql() -> None:
    with pytest.raises(InvalidInputError):
        listen_heads("sqlite:///x.db", print, threading.Event())
