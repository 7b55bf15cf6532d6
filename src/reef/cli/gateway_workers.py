"""``reef serve --workers N``: N gateway processes on one port, supervised by the parent.

The parent binds the port (``reef.cli.listener``) and hands that one socket to every
child, rather than each child binding its own with ``SO_REUSEPORT``:

- the port is checked once, before any store is opened or engine loaded, as with one
  process, and it stays bound while a child is restarted, so no connection is refused
  in between;
- the children share one accept queue, so connections a dying child had not yet
  accepted are taken by another (with ``SO_REUSEPORT`` each socket has its own queue,
  and a closed one resets what it held);
- no other process of the same user can join the port.

Children are fresh interpreters (``python -m reef.cli.gateway_child``), not forks: the
parent may hold threads (the learning worker, the engine's log drain) and open database
connections that a fork would copy. Each child gets the merged settings (JSON on its
stdin: secrets included, never on a command line), the socket and a pipe on which it
says it is ready. Each runs in a process group of its own, so a terminal's Ctrl-C
reaches only the parent, which forwards each SIGINT or SIGTERM to every child: the
first drains, a second Ctrl-C cuts what is in flight (``reef.cli.serving``). A child
that dies while serving is logged and replaced; one that dies before it was ready
stops them all (a start error would only repeat). Once all have drained, the parent
cleans up and ends as one process would: 130 after Ctrl-C, killed by SIGTERM; it
exits 1 when a child failed to start or ended other than by the signal it was sent.

``/metrics`` sums over the children through prometheus_client's multiprocess mode: the
parent makes the directory and passes it as ``PROMETHEUS_MULTIPROC_DIR``
(``reef.gateway.metrics``). The learning worker's spend counts, kept in the parent, are
published there too (``reef.experience.learning_spend``) for the children to show.
"""

from __future__ import annotations

import json
import logging
import os
import queue
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

    def run(self, on_ready: Callable[[], None]) -> int | None:
        for index in range(1, self.settings.server.workers + 1):
            self._start(index)
        announced = False
        while self.alive:
            kind, payload = self.events.get()
            if kind == "signal" and isinstance(payload, int):
                self._signal(payload)
            elif kind == "ready" and isinstance(payload, _Child):
                self.ready.add(payload.process.pid)
                if not announced and not self.stopping and len(self.ready) == len(self.alive):
                    announced = True
                    on_ready()
            elif kind == "exit" and isinstance(payload, _Child):
                self._exited(payload)
        if self.failures:
            raise GatewayWorkersError("; ".join(self.failures))
        return self.stopped_by

    def _start(self, index: int) -> None:
        read_end, write_end = os.pipe()
        start = {
            "settings": settings_json(self.settings),
            "index": index,
            "listener_fd": self.listener.fileno(),
            "ready_fd": write_end,
            "parent_pid": os.getpid(),
            "log_level": self.log_level,
        }
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "reef.cli.gateway_child"],
                stdin=subprocess.PIPE,
                pass_fds=(self.listener.fileno(), write_end),
                env={**os.environ, MULTIPROC_ENV: self.metrics_dir},
                process_group=0,
            )
        finally:
            os.close(write_end)
        child = _Child(index, process)
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
        self.stopping = True
        for child in self.alive.values():
            child.process.send_signal(signum)  # one already gone: its exit event is queued

    def _exited(self, child: _Child) -> None:
        pid, code = child.process.pid, child.process.returncode
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
