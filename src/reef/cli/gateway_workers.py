"""``reef serve --workers N``: N gateway processes on one port, supervised by the parent.

The parent binds the port (``reef.cli.listener``), listens once every child is ready,
accepts every connection itself and sends it to a child (``_Dispatcher``), rather than
each child binding its own socket with ``SO_REUSEPORT``:

- the port is checked once, before any store is opened or engine loaded, as with one
  process, and it stays bound while a child is restarted, so no connection is refused
  in between;
- connections not yet accepted wait in the parent's one queue, so a dying child takes
  none of them with it (with ``SO_REUSEPORT`` each socket has its own queue, and a
  closed one resets what it held);
- no other process of the same user can join the port.

Balance. Each connection goes to the ready child with the fewest open connections
(ties in turn), sent with its descriptor on a Unix socket pair (``socket.send_fds``);
the child serves it with uvicorn's own protocol (``loop.connect_accepted_socket``) and
sends a byte back when it has closed it. Children used to share the listening socket
and accept from its queue, and the first to wake took a whole burst: uvloop (libuv)
accepts until the queue is empty, as asyncio does up to its ``backlog``. A client pool
opening 32 keep-alive connections at once (the pool of ``bench/gateway_overhead.py``)
left all 32 on one child in 6 of 11 runs (2 cores, load average ~7), and at best 15/17
(some of those runs began before the second child listened: the parent now listens
only once all are ready); 16 connections opened after both were ready (the test in
``tests/gateway/test_workers.py``) all went to one child in 3 of 4 runs. libuv's
``UV_TCP_SINGLE_ACCEPT`` still left all 32 on one child in 2 of 6 runs and 28/4 or
30/2 in 3 more. Limiting what a child accepts per wakeup cannot fix it: a child not
scheduled at the moment loses every race, which on a loaded machine is most of a
burst. Sent by the parent, the same pool got 16/16 in each of 15 runs. Round robin
alone was not enough: a client alternating short connections with long ones (a
metrics scrape between requests) had all its long ones sent to the same child.
``SO_REUSEPORT`` balances by a hash of the addresses, blind to load, and gives up the
guarantees above. The parent's cost is one ``accept`` and one ``sendmsg`` per
connection, in a thread of its own, nothing per request on a kept-alive connection.

Children are fresh interpreters (``python -m reef.cli.gateway_child``), not forks: the
parent may hold threads (the learning worker, the engine's log drain) and open database
connections that a fork would copy. Each child gets the merged settings (JSON on its
stdin: secrets included, never on a command line), its end of the socket pair and a
pipe on which it says it is ready. Each runs in a process group of its own, so a
terminal's Ctrl-C reaches only the parent, which forwards each SIGINT or SIGTERM to
every child: the first drains, a second Ctrl-C cuts what is in flight
(``reef.cli.serving``). A child that dies while serving is logged and replaced; one
that dies before it was ready stops them all (a start error would only repeat). Once
all have drained, the parent cleans up and ends as one process would: 130 after
Ctrl-C, killed by SIGTERM; it exits 1 when a child failed to start or ended other than
by the signal it was sent.

``/metrics`` sums over the children through prometheus_client's multiprocess mode: the
parent makes the directory and passes it as ``PROMETHEUS_MULTIPROC_DIR``
(``reef.gateway.metrics``). The learning worker's spend counts, kept in the parent, are
published there too (``reef.experience.learning_spend``) for the children to show.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pydantic import SecretStr
from pydantic_core import to_jsonable_python

from reef.config import ConfigError, ReefSettings
from reef.core.errors import ReefError

log = logging.getLogger("reef.serve")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class GatewayWorkersError(ReefError):
    """A gateway process failed to start, or one exited with an error while stopping."""


def for_workers(settings: ReefSettings) -> ReefSettings:
    """The settings every gateway process gets, so that limits hold for the whole port:
    spend is counted in the store (``budgets.ledger: auto`` becomes ``store``), and each
    process enforces its share of the rate limits (``rate_limits.replicas`` times the
    workers, as for separate gateways).

    Raises ``ConfigError`` for ``budgets.ledger: memory`` with budgets set: each process
    would allow the whole budget."""
    workers = settings.server.workers
    budgets = settings.budgets
    if budgets.ledger == "memory" and budgets.any:
        raise ConfigError(
            f"budgets.ledger: memory counts spend in each gateway process, so {workers} "
            "workers (server.workers) would each allow the whole budget; set "
            "budgets.ledger to store or auto, or server.workers to 1"
        )
    if budgets.ledger == "auto":
        budgets = budgets.model_copy(update={"ledger": "store"})
    replicas = settings.rate_limits.replicas * workers
    limits = settings.rate_limits.model_copy(update={"replicas": replicas})
    return settings.model_copy(update={"budgets": budgets, "rate_limits": limits})


def settings_json(settings: ReefSettings) -> str:
    """``settings`` as JSON that ``ReefSettings.model_validate_json`` reads back equal,
    secrets included (the child needs the upstream keys): for a pipe, never a file."""

    def reveal(value: object) -> object:
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        return to_jsonable_python(value)

    return json.dumps(settings.model_dump(mode="python", round_trip=True), default=reveal)


@dataclass(frozen=True)
class _Child:
    index: int
    process: subprocess.Popen[bytes]
    channel: socket.socket  # our end of the pair its connections are sent on


# uvicorn's default listen backlog, which each child passed to listen() when it served
# the socket itself.
LISTEN_BACKLOG = 2048


class _Dispatcher:
    """Accepts every connection on the listener, in a thread of the parent, and sends
    each to the ready child with the fewest open connections (``socket.send_fds`` on its
    channel; ties in turn), skipping one whose channel is full or closed. A child sends
    a byte back on its channel for each connection it has closed."""

    def __init__(self, listener: socket.socket) -> None:
        self._listener = listener
        self._lock = threading.Lock()
        self._children: list[_Child] = []  # ready, taking connections
        self._closing: list[_Child] = []  # removed while the thread may watch them
        self._turn = 0
        self._open: dict[int, int] = {}  # by pid: sent and not yet reported closed
        self._stop = threading.Event()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._thread: threading.Thread | None = None

    def add(self, child: _Child) -> None:
        """Send connections to ``child`` too."""
        with self._lock:
            self._children.append(child)
        self._wake()

    def remove(self, child: _Child) -> None:
        """Send ``child`` no more, and close its channel."""
        with self._lock:
            watched = child in self._children and self._thread is not None
            if child in self._children:
                self._children.remove(child)
            if watched and not self._stop.is_set():
                self._closing.append(child)  # the thread closes it once it stops watching
            else:
                child.channel.close()
        self._wake()

    def start(self) -> None:
        """Listen, and dispatch what comes: once every child is ready, so that the first
        connections are not all sent to the one that started first."""
        if self._thread is None and not self._stop.is_set():
            self._listener.listen(LISTEN_BACKLOG)
            self._listener.setblocking(False)
            self._thread = threading.Thread(
                target=self._run, name="reef-gateway-accept", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Accept no more: what is still queued on the listener waits there, as with one
        process that is draining, until the listener is closed."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for child in [*self._children, *self._closing]:
                child.channel.close()
            self._children.clear()
            self._closing.clear()
        self._wake_read.close()
        self._wake_write.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already awake (full) or stopped (closed)
            self._wake_write.send(b"x")

    def _run(self) -> None:
        watched: dict[int, _Child] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while not self._stop.is_set():
                try:
                    self._dispatch(selector, watched)
                except Exception:  # a bug here must not leave the port unserved
                    log.exception("dispatching connections to gateway processes failed")
                    self._stop.wait(1.0)

    def _dispatch(self, selector: selectors.BaseSelector, watched: dict[int, _Child]) -> None:
        self._watch(selector, watched)
        for key, _ in selector.select():
            if key.fileobj is self._listener:
                self._accept_queued()
            elif key.fileobj is self._wake_read:
                with contextlib.suppress(BlockingIOError):
                    self._wake_read.recv(4096)
            elif isinstance(key.data, _Child):
                self._closed_by(key.data, selector, watched)

    def _watch(self, selector: selectors.BaseSelector, watched: dict[int, _Child]) -> None:
        """Watch the channels of the children taking connections, and only those."""
        with self._lock:
            for child in self._children:
                if child.process.pid not in watched:
                    selector.register(child.channel, selectors.EVENT_READ, child)
                    watched[child.process.pid] = child
                    self._open[child.process.pid] = 0
            for child in self._closing:
                if watched.pop(child.process.pid, None) is not None:
                    selector.unregister(child.channel)
                self._open.pop(child.process.pid, None)
                child.channel.close()
            self._closing.clear()

    def _closed_by(
        self, child: _Child, selector: selectors.BaseSelector, watched: dict[int, _Child]
    ) -> None:
        """Count the connections ``child`` says it closed; at the end of its channel (it
        has died), send it no more."""
        try:
            closed = len(child.channel.recv(4096))  # a byte per closed connection
        except BlockingIOError:
            return
        except OSError:
            closed = 0
        if closed:
            pid = child.process.pid
            self._open[pid] = max(0, self._open.get(pid, 0) - closed)
            return
        with self._lock:
            if child in self._children:
                self._children.remove(child)
            selector.unregister(child.channel)
            del watched[child.process.pid]
            self._open.pop(child.process.pid, None)

    def _accept_queued(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # reset by its client while queued
            except OSError as exc:  # out of descriptors: the queue waits a little
                log.warning("cannot accept a connection (%s); retrying in 1 s", exc)
                self._stop.wait(1.0)
                return
            with connection:  # the child has its own copy once sent
                self._send(connection)

    def _send(self, connection: socket.socket) -> None:
        with self._lock:
            children = [c for c in self._children if c.process.pid in self._open]
        self._turn += 1
        turn = self._turn
        ranked = sorted(
            range(len(children)),
            key=lambda i: (self._open[children[i].process.pid], (i - turn) % len(children)),
        )
        for i in ranked:
            child = children[i]
            try:
                socket.send_fds(child.channel, [b"c"], [connection.fileno()])
            except OSError:
                continue  # its channel is full (a stuck child) or it has died
            self._open[child.process.pid] += 1
            return
        log.warning("no gateway process could take a connection; it was closed")


# How a child ends when told to stop: drained, then uvicorn raises the signal again
# (SIGTERM kills it; SIGINT is a KeyboardInterrupt, exit 130).
_STOPPED = frozenset({0, 130, -signal.SIGTERM, -signal.SIGINT})

# Events the main thread waits on: ("ready", child), ("exit", child), ("signal", signum).
_Event = tuple[str, object]


def supervise(
    settings: ReefSettings,
    listener: socket.socket,
    log_level: str,
    on_ready: Callable[[], None],
    metrics_dir: Path | None = None,
) -> int | None:
    """Run ``settings.server.workers`` gateway processes on ``listener`` until SIGINT or
    SIGTERM, then wait until they have drained. ``on_ready`` runs once all answer.
    Returns the signal that stopped them, for the caller to raise once it has cleaned
    up, so the exit code is one process's: 130 after Ctrl-C, killed by SIGTERM.
    ``metrics_dir``: the children's ``PROMETHEUS_MULTIPROC_DIR`` (default: a new one),
    removed at the end either way.

    Raises ``GatewayWorkersError`` when a child fails before it is ready, or stops
    other than by the signal it was sent."""
    directory = str(metrics_dir or tempfile.mkdtemp(prefix="reef-metrics-"))
    events: queue.SimpleQueue[_Event] = queue.SimpleQueue()

    def forward(signum: int, _frame: FrameType | None) -> None:
        events.put(("signal", signum))  # SimpleQueue.put is safe in a signal handler

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _Supervisor(settings, listener, log_level, directory, events).run(on_ready)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(directory, ignore_errors=True)


class _Supervisor:
    def __init__(
        self,
        settings: ReefSettings,
        listener: socket.socket,
        log_level: str,
        metrics_dir: str,
        events: queue.SimpleQueue[_Event],
    ) -> None:
        self.settings = settings
        self.listener = listener
        self.log_level = log_level
        self.metrics_dir = metrics_dir
        self.events = events
        self.alive: dict[int, _Child] = {}  # by pid
        self.ready: set[int] = set()  # pids that said they are ready
        self.stopping = False
        self.stopped_by: int | None = None
        self.failures: list[str] = []
        self.dispatcher = _Dispatcher(listener)

    def run(self, on_ready: Callable[[], None]) -> int | None:
        try:
            self._run(on_ready)
        finally:
            self.dispatcher.stop()
        if self.failures:
            raise GatewayWorkersError("; ".join(self.failures))
        return self.stopped_by

    def _run(self, on_ready: Callable[[], None]) -> None:
        for index in range(1, self.settings.server.workers + 1):
            self._start(index)
        announced = False
        while self.alive:
            kind, payload = self.events.get()
            if kind == "signal" and isinstance(payload, int):
                self._signal(payload)
            elif kind == "ready" and isinstance(payload, _Child):
                self.ready.add(payload.process.pid)
                if not self.stopping:
                    self.dispatcher.add(payload)
                if not announced and not self.stopping and len(self.ready) == len(self.alive):
                    announced = True
                    self.dispatcher.start()
                    on_ready()
            elif kind == "exit" and isinstance(payload, _Child):
                self._exited(payload)

    def _start(self, index: int) -> None:
        read_end, write_end = os.pipe()
        # Datagrams with boundaries: one connection's descriptor per message.
        channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        channel.setblocking(False)  # a stuck child's full channel is skipped, not waited on
        start = {
            "settings": settings_json(self.settings),
            "index": index,
            "connections_fd": theirs.fileno(),
            "ready_fd": write_end,
            "parent_pid": os.getpid(),
            "log_level": self.log_level,
        }
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "reef.cli.gateway_child"],
                stdin=subprocess.PIPE,
                pass_fds=(theirs.fileno(), write_end),
                env={**os.environ, MULTIPROC_ENV: self.metrics_dir},
                process_group=0,
            )
        except BaseException:
            channel.close()
            raise
        finally:
            os.close(write_end)
            theirs.close()
        child = _Child(index, process, channel)
        self.alive[process.pid] = child
        assert process.stdin is not None
        process.stdin.write(json.dumps(start).encode())
        process.stdin.close()
        threading.Thread(
            target=self._watch, args=(child, read_end), name=f"reef-gateway-{index}", daemon=True
        ).start()

    def _watch(self, child: _Child, read_end: int) -> None:
        with os.fdopen(read_end, "rb", buffering=0) as ready:
            if ready.read(1):
                self.events.put(("ready", child))
        child.process.wait()
        self.events.put(("exit", child))

    def _signal(self, signum: int) -> None:
        if not self.stopping and signum in (signal.SIGINT, signal.SIGTERM):
            self.stopped_by = signum
        if not self.stopping:
            self.dispatcher.stop()  # the children drain what they have
        self.stopping = True
        for child in self.alive.values():
            child.process.send_signal(signum)  # one already gone: its exit event is queued

    def _exited(self, child: _Child) -> None:
        pid, code = child.process.pid, child.process.returncode
        self.dispatcher.remove(child)
        del self.alive[pid]
        was_ready = pid in self.ready
        self.ready.discard(pid)
        if self.stopping:
            if code not in _STOPPED:
                self.failures.append(f"gateway process {child.index} exited with {code}")
            return
        if not was_ready:
            self.failures.append(
                f"gateway process {child.index} exited with {code} before it was ready; "
                "its log above says why"
            )
            self._signal(signal.SIGTERM)
            return
        log.error(
            "gateway process %d (pid %d) exited with %s; starting another",
            child.index,
            pid,
            code,
        )
        self._start(child.index)
