"""What ``reef serve`` runs, started piece by piece so the quickstart can drive it and
stop it cleanly: the embedded engine (a child process whose log goes to a file), the
gateway (uvicorn on a thread) and a learning worker (a thread).

The quickstart is a composition root, like ``reef serve``: it opens the database and
builds the stores on it itself, and reads jobs, candidates and evaluations from them
directly.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import TracebackType

import uvicorn

from reef.cli.local_engine import (
    DEFAULT_LOCAL_MODEL,
    EngineStartError,
    LocalEngine,
    engine_options,
)
from reef.config import ReefSettings
from reef.db import Database, open_database
from reef.engine.process import ReadyInfo
from reef.experience import SQLExperienceStore
from reef.gateway import create_app
from reef.jobs import JobQueue
from reef.quickstart.errors import QuickstartError
from reef.releases import ArtifactStore, ReleaseChain, open_artifact_store
from reef.upstream import Upstream, build_upstream

log = logging.getLogger("reef.quickstart")

ENGINE_START_TIMEOUT_SECONDS = 600.0  # a first start converts the GGUF (a few seconds)
GATEWAY_START_TIMEOUT_SECONDS = 30.0


class Stack:
    """Engine, gateway and worker for ``settings`` (whose one ``type: local`` upstream is
    the engine's), on loopback at ``settings.server.port``. Use as a context manager: on exit
    the worker finishes its job, the gateway drains its captures, the engine stops."""

    def __init__(self, settings: ReefSettings, engine_log: Path) -> None:
        self.settings = settings
        self.engine_log = engine_log
        self.engine: LocalEngine | None = None
        self.database: Database | None = None
        self.store: SQLExperienceStore | None = None
        self._server: uvicorn.Server | None = None
        self._server_thread: threading.Thread | None = None
        self._worker_thread: threading.Thread | None = None
        self._worker_stop = threading.Event()

    @property
    def url(self) -> str:
        """The gateway's base URL (without ``/v1``)."""
        return f"http://127.0.0.1:{self.settings.server.port}"

    def start_engine(self) -> ReadyInfo:
        """Start the engine of the (single) local upstream and point the upstream at it
        (any other upstream, ``--task distill``'s teacher, is kept as it is)."""
        upstreams = self.settings.upstreams
        [(name, upstream)] = [(n, u) for n, u in upstreams.items() if u.type == "local"]
        # Started from the calling (main) thread: the child's PR_SET_PDEATHSIG is tied to
        # the thread that forks it, so it must live as long as the quickstart does.
        self.engine = LocalEngine(
            name,
            upstream.model or DEFAULT_LOCAL_MODEL,
            self.settings.home,
            self.engine_log,
            options=engine_options(upstream),
        )
        try:
            ready = self.engine.start(ENGINE_START_TIMEOUT_SECONDS)
        except EngineStartError as error:
            raise QuickstartError(error.message) from error
        resolved = upstream.model_copy(
            update={"type": "openai", "base_url": ready.base_url, "model": ready.model}
        )
        self.settings = self.settings.model_copy(
            update={"upstreams": {**upstreams, name: resolved}}
        )
        return ready

    def start_gateway(self) -> None:
        """Open the database and serve the gateway on a thread until ``close``."""
        self.database = open_database(self.settings.store_url())
        self.store = SQLExperienceStore(self.database)
        upstreams: dict[str, Upstream] = {
            name: build_upstream(name, config) for name, config in self.settings.upstreams.items()
        }
        app = create_app(self.settings, self.database, self.store, upstreams)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.settings.server.port,
            log_level="warning",
            lifespan="on",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._server_thread = threading.Thread(
            target=self._server.run, name="reef-gateway", daemon=True
        )
        self._server_thread.start()
        deadline = time.monotonic() + GATEWAY_START_TIMEOUT_SECONDS
        while not self._server.started:
            if not self._server_thread.is_alive() or time.monotonic() > deadline:
                raise QuickstartError(
                    f"the gateway did not start on port {self.settings.server.port} "
                    "(is the port taken? try --port)"
                )
            time.sleep(0.05)

    def start_worker(self) -> None:
        """A learning worker on a thread, as ``reef serve`` runs it."""
        from reef.cli.stores import build_worker

        if self.store is None:
            raise QuickstartError("the gateway has not started")
        worker = build_worker(self.settings, self.require_database(), self.store)
        self._worker_thread = threading.Thread(
            target=worker.run_forever, args=(self._worker_stop,), name="reef-worker", daemon=True
        )
        self._worker_thread.start()

    def require_database(self) -> Database:
        """The open database; ``QuickstartError`` before ``start_gateway``."""
        if self.database is None:
            raise QuickstartError("the gateway has not started")
        return self.database

    def chain(self) -> ReleaseChain:
        """The release chain in the database."""
        return ReleaseChain(self.require_database())

    def jobs(self) -> JobQueue:
        """The learning jobs in the database."""
        return JobQueue(self.require_database())

    def artifacts(self) -> ArtifactStore:
        """The artifact store."""
        return open_artifact_store(self.settings.artifacts_url())

    def close(self) -> None:
        """Stop the worker (it ends its running job first), the gateway, the engine."""
        self._worker_stop.set()
        if self._worker_thread is not None:
            self._worker_thread.join(timeout=60)
        if self._server is not None and self._server_thread is not None:
            self._server.should_exit = True
            self._server_thread.join(timeout=30)
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.database is not None:
            self.database.close()
            self.database = None
        if self.engine is not None:
            self.engine.stop()

    def __enter__(self) -> Stack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
