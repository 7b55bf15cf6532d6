"""``reef serve``: open the database, build upstreams, run the gateway under uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from pydantic import SecretStr

from reef.cli.listener import bind_listener, display_base_url, host_port
from reef.config import ApiKeyConfig, ReefSettings
from reef.core.errors import ReefError, require_extra
from reef.db import Database, open_database
from reef.environments import hide_from_tools, log_tool_isolation
from reef.experience import LEARNING_SPEND, ExperienceStore, SQLExperienceStore
from reef.gateway import create_app
from reef.gateway.app import InferenceFastPath
from reef.gateway.shutdown import Shutdown
from reef.upstream import Upstream, build_upstream

if TYPE_CHECKING:
    from reef.cli.local_engine import LocalEngine

log = logging.getLogger("reef.serve")


GATE_KEY_ID = "reef-gate"


class GatewayStartError(ReefError):
    """uvicorn returned without ever accepting connections."""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def effective_host(settings: ReefSettings) -> str:
    """Where to listen: never beyond loopback without API keys."""
    host = settings.bind_host()
    if not settings.auth.keys:
        if not _is_loopback(host):
            log.warning(
                "no API keys configured: refusing to listen on %s; listening on 127.0.0.1 "
                "only (configure auth.keys to serve other hosts)",
                host,
            )
            return "127.0.0.1"
        log.warning("no API keys configured: anyone on this machine can use the gateway")
    return host


def guard_tools(settings: ReefSettings) -> None:
    """Keep Reef's home, database and artifacts out of every tool sandbox, and say at
    start-up when the python environment's tools would run without one."""
    hidden = [settings.home]
    for url in (settings.store_url(), settings.artifacts_url()):
        if url.startswith("sqlite:///"):
            hidden.append(Path(url.removeprefix("sqlite:///")))
        elif "://" not in url:
            hidden.append(Path(url))
    hide_from_tools(*hidden)
    log_tool_isolation()


def with_gate_key(settings: ReefSettings) -> ReefSettings:
    """When keys are configured and ``evaluation.api_key`` is not, a random admin key
    (``reef-gate``) that only this process knows, for its own worker's eval calls: held in
    memory, never written anywhere."""
    if not settings.auth.keys or settings.evaluation.api_key is not None:
        return settings
    secret = secrets.token_urlsafe(32)
    key = ApiKeyConfig(id=GATE_KEY_ID, key=SecretStr(secret), role="admin")
    auth = settings.auth.model_copy(update={"keys": [*settings.auth.keys, key]})
    evaluation = settings.evaluation.model_copy(update={"api_key": SecretStr(secret)})
    return settings.model_copy(update={"auth": auth, "evaluation": evaluation})


def _start_worker(
    settings: ReefSettings, database: Database, store: ExperienceStore
) -> tuple[threading.Thread, threading.Event]:
    """A learning worker on a thread of this process. Model training runs in child
    processes, so the gateway's event loop never competes with a training step."""
    from reef.cli.stores import build_worker

    worker = build_worker(settings, database, store)
    stop = threading.Event()
    thread = threading.Thread(
        target=worker.run_forever, args=(stop,), name="reef-worker", daemon=True
    )
    thread.start()
    return thread, stop


# After a cut, how long streams get to send their last event before uvicorn cancels
# what is left (a stuck client): the cut itself ends them at once.
_CUT_MARGIN_SECONDS = 5.0


def waiting_message(requests: int, grace_seconds: float) -> str:
    """What ``reef serve`` prints when asked to stop with ``requests`` in flight."""
    noun = "request" if requests == 1 else "requests"
    return f"waiting for {requests} {noun}, {grace_seconds:g} s grace; Ctrl-C again to abort"


# Connections a gateway process takes from its channel per read (``reef serve --workers``).
_FDS_PER_READ = 16


def _counting_protocol(
    opened: Callable[[], None], closed: Callable[[], None]
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, calling ``opened`` as it takes a connection and
    ``closed`` once that has ended."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Counting(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            opened()
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            try:
                super().connection_lost(exc)
            finally:
                closed()

    return Counting


class _ReadyServer(uvicorn.Server):
    """uvicorn's server, calling ``on_ready`` once it accepts connections, and stopping
    in order: asked to stop, it says how many requests it waits for and for how long;
    when the grace ends, or at a second Ctrl-C, what ``shutdown`` has in flight is cut
    (a stream ends with an error event, a call still waiting for its upstream gets a
    503, and the records say the gateway stopped) rather than cancelled mid-write. A
    third Ctrl-C exits at once, as uvicorn does.

    With ``channel`` (a gateway process of ``reef serve --workers``), it serves the
    connections that the parent accepted and sent on that socket, rather than listening.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_ready: Callable[[], None],
        shutdown: Shutdown,
        grace_seconds: float,
        channel: socket.socket | None = None,
    ) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self._inflight = shutdown
        self._grace_seconds = grace_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cut_asked = False
        self._channel = channel
        self._handed: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            if self._channel is not None:
                self._channel.setblocking(False)
                self._loop.add_reader(self._channel.fileno(), self._take_connections)
            self._on_ready()

    def _take_connections(self) -> None:
        """Serve every connection the parent has sent on the channel so far."""
        assert self._channel is not None and self._loop is not None
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self._channel, 1, _FDS_PER_READ)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message, fds = b"", []
            if not message and not fds:  # the parent has gone: a SIGTERM follows
                self._stop_taking()
                return
            for fd in fds:
                task = self._loop.create_task(self._serve_connection(socket.socket(fileno=fd)))
                self._handed.add(task)
                task.add_done_callback(self._handed.discard)

    async def _serve_connection(self, connection: socket.socket) -> None:
        """As uvicorn serves a connection it accepted itself; the parent is told when it
        is closed (a byte on the channel), to send the next to the least busy process."""
        assert self._loop is not None
        config = self.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        try:
            await self._loop.connect_accepted_socket(protocol, connection)
        except OSError:
            connection.close()  # reset by its client before we got to it
            self.closed()

    def closed(self) -> None:
        """A connection has ended: with a channel, the parent is told."""
        if self._channel is not None:
            with contextlib.suppress(OSError):  # the parent has gone, or is not reading
                self._channel.send(b"-")

    def _stop_taking(self) -> None:
        if self._channel is not None and self._loop is not None:
            self._loop.remove_reader(self._channel.fileno())
            self._channel.close()
            self._channel = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A signal: the first asks to stop (uvicorn's), a second Ctrl-C ends the grace
        now; any later one is uvicorn's forced exit."""
        loop = self._loop
        if self.should_exit and sig == signal.SIGINT and not self._cut_asked and loop:
            self._cut_asked = True
            loop.call_soon_threadsafe(self._cut)
            return
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._stop_taking()  # as uvicorn closes its listening servers
        waiting = len(self.server_state.tasks)
        if waiting:
            print(waiting_message(waiting, self._grace_seconds), flush=True)
        timer = asyncio.get_running_loop().call_later(self._grace_seconds, self._cut)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            timer.cancel()

    def _cut(self) -> None:
        if self._inflight.cutting:
            return
        cut = self._inflight.cut()
        if cut:
            noun = "request" if cut == 1 else "requests"
            print(f"cutting {cut} {noun} still running: the gateway stopped", flush=True)


NO_KEYS_LINE = (
    "none: every caller that reaches this port is an admin, so it listens on loopback "
    "only; configure auth.keys before exposing it (docs/security.md)"
)


def ready_message(base_url: str, keys: int) -> str:
    """What ``reef serve`` prints on stdout once it answers: where to send requests,
    the dashboard and the API docs, and whether callers need a key (``keys``: how many
    are configured)."""
    access = f"required ({keys} configured in auth.keys)" if keys else NO_KEYS_LINE
    return (
        "Reef is ready:\n"
        f"  gateway    {base_url}/v1   (OpenAI and Anthropic APIs)\n"
        f"  dashboard  {base_url}/ui\n"
        f"  API docs   {base_url}/docs\n"
        f"  keys       {access}"
    )


def run_gateway(settings: ReefSettings, with_worker: bool = True, log_level: str = "INFO") -> None:
    """Serve until interrupted; on exit, captures are drained and connections closed.

    The port is bound first: ``PortUnavailableError`` (naming ``--port``/``server.port``)
    comes before any store is opened or model loaded. Once the gateway answers, the
    gateway, dashboard and docs URLs are printed on stdout. With ``server.workers`` above
    1, that many gateway processes serve the port (``reef.cli.gateway_workers``).
    """
    host = effective_host(settings)
    listener = bind_listener(host, settings.server.port)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started with SIGINT ignored (a script's background job): uvicorn handles it
        # while serving regardless, so the exit after it is the same as in the
        # foreground, 130 (tests/cli/test_serve_shutdown.py, run from such a job).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        stopped_by = _serve(settings, listener, with_worker, log_level)
    finally:
        listener.close()
    if stopped_by is not None:
        # As one uvicorn process ends, now that everything is closed: SIGINT is a
        # KeyboardInterrupt (exit 130), SIGTERM kills us.
        signal.raise_signal(stopped_by)


def _serve(
    settings: ReefSettings, listener: socket.socket, with_worker: bool, log_level: str
) -> int | None:
    host, port = listener.getsockname()[:2]
    if settings.server.workers > 1:
        from reef.cli.gateway_workers import for_workers

        settings = for_workers(settings)  # before anything starts: it may refuse
    settings.home.mkdir(parents=True, exist_ok=True)
    guard_tools(settings)
    database = open_database(settings.store_url())  # migrated on open, once
    store = SQLExperienceStore(database)
    engines: list[LocalEngine] = []
    worker: tuple[threading.Thread, threading.Event] | None = None
    metrics_dir: Path | None = None  # with several gateway processes
    try:
        if any(config.type == "local" for config in settings.upstreams.values()):
            from reef.cli.local_engine import start_local_upstreams

            require_extra("local", "the embedded engine (an upstream of type: local)")
            # One engine for every gateway process: they get its URL, not their own.
            resolved, engines = start_local_upstreams(dict(settings.upstreams), settings.home)
            settings = settings.model_copy(update={"upstreams": resolved})
        if with_worker:
            settings = with_gate_key(settings)
        # Keys the operator configured: the worker's own gate key is not theirs.
        configured = sum(1 for key in settings.auth.keys if key.id != GATE_KEY_ID)
        message = ready_message(display_base_url(host, port), configured)
        log.info(
            "Reef gateway on http://%s (store %s, %d gateway process%s)",
            host_port(host, port),
            settings.store_url(),
            settings.server.workers,
            "" if settings.server.workers == 1 else "es",
        )
        if settings.server.workers == 1:
            app = create_app(settings, database, store, _upstreams(settings))
            worker = _start_worker(settings, database, store) if with_worker else None
            serve_app(app, settings, listener, lambda: print(message, flush=True))
            return None  # uvicorn raised the signal that stopped it, if any
        else:
            from reef.cli.gateway_workers import supervise
            from reef.experience import LEARNING_SPEND_FILE

            # The learning worker runs here, in the parent: once, whatever the workers.
            # Its spend counts go where the children's /metrics read them.
            metrics_dir = Path(tempfile.mkdtemp(prefix="reef-metrics-"))
            LEARNING_SPEND.publish_to(metrics_dir / LEARNING_SPEND_FILE)
            worker = _start_worker(settings, database, store) if with_worker else None
            return supervise(
                settings,
                listener,
                log_level,
                lambda: print(message, flush=True),
                metrics_dir=metrics_dir,
            )
    finally:
        if worker is not None:
            thread, stop = worker
            stop.set()
            thread.join(timeout=30)
        if metrics_dir is not None:
            LEARNING_SPEND.publish_to(None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
        for engine in engines:
            engine.stop()
        store.close()
        database.close()


def _upstreams(settings: ReefSettings) -> dict[str, Upstream]:
    return {name: build_upstream(name, config) for name, config in settings.upstreams.items()}


def serve_gateway_process(
    settings: ReefSettings, channel: socket.socket, on_ready: Callable[[], None], index: int
) -> None:
    """One gateway process of several (``index`` from 1): its own database connections,
    upstream clients and app, serving the connections the parent sends on ``channel``
    (``reef.cli.gateway_workers``); no learning worker, no engine."""
    guard_tools(settings)
    database = open_database(settings.store_url())
    store = SQLExperienceStore(database)
    try:
        app = create_app(settings, database, store, _upstreams(settings))
        app.state.reef.worker = index
        serve_app(app, settings, None, on_ready, channel=channel)
    finally:
        store.close()
        database.close()


def serve_app(
    app: InferenceFastPath,
    settings: ReefSettings,
    listener: socket.socket | None,
    on_ready: Callable[[], None],
    channel: socket.socket | None = None,
) -> None:
    """Run ``app`` under uvicorn on ``listener``, or on the connections sent on
    ``channel``, until asked to stop; ``on_ready`` once it accepts connections. Raises
    ``GatewayStartError`` when it never started."""
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",  # counting its connections, below
        access_log=settings.server.access_log,
        log_level="warning",
        timeout_graceful_shutdown=math.ceil(
            settings.server.shutdown_grace_seconds + _CUT_MARGIN_SECONDS
        ),
        # Forwarded headers are not trusted by default; nothing here reads them.
        proxy_headers=False,
    )
    server = _ReadyServer(
        config,
        on_ready,
        app.state.reef.shutdown,
        settings.server.shutdown_grace_seconds,
        channel,
    )
    count, worker = app.state.reef.metrics.count_connection, app.state.reef.worker or 1
    config.http = _counting_protocol(lambda: count(worker), server.closed)  # read at run
    server.run(sockets=[] if listener is None else [listener])
    if not server.started:
        raise GatewayStartError("the gateway did not start; its log above says why")
