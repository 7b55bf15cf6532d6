"""Starting the embedded engine as a child of ``reef serve`` for ``type: local`` upstreams."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from reef.config import UpstreamConfig
from reef.core.errors import ReefError
from reef.engine.process import EngineOptions, ReadyInfo, engine_command, parse_ready_line

log = logging.getLogger("reef.serve")

DEFAULT_LOCAL_MODEL = "smollm2-135m"
_START_TIMEOUT_SECONDS = 900.0  # a first start converts the GGUF; slow disks take minutes


class EngineStartError(ReefError):
    """The embedded engine exited or stayed silent instead of becoming ready."""


class LocalEngine:
    """One engine child process: started on a free loopback port, stopped on exit.

    The child also dies with the thread that started it (``PR_SET_PDEATHSIG``), so even a
    SIGKILL of ``reef serve`` leaves no orphan: start it from a thread that lives as long
    as the engine is needed. Its log (conversion and loading progress) goes to our
    stderr as it happens, or to ``log_path`` when given (then quoted in start errors).
    """

    def __init__(
        self,
        name: str,
        source: str,
        home: Path,
        log_path: Path | None = None,
        options: EngineOptions | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.home = home
        self.log_path = log_path
        self.options = options or EngineOptions()
        self.process: subprocess.Popen[str] | None = None
        self._stdout_drain: threading.Thread | None = None
        self._log: IO[str] | None = None

    def start(self, timeout_seconds: float = _START_TIMEOUT_SECONDS) -> ReadyInfo:
        """Start the child and wait for its READY line; raises ``EngineStartError``."""
        command = engine_command(self.source, self.home, options=self.options)
        log.info("starting the embedded engine (%s) for upstream %r", self.source, self.name)
        started = time.monotonic()
        if self.log_path is not None:
            self._log = self.log_path.open("a", encoding="utf-8")
        self.process = subprocess.Popen(  # noqa: S603 (argv of our own interpreter, no shell)
            command,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            # A group of its own: a terminal's Ctrl-C reaches only ``reef serve``, whose
            # streams from this engine go on through their grace; ``stop`` ends it after.
            process_group=0,
        )
        assert self.process.stdout is not None
        ready: ReadyInfo | None = None
        for line in self.process.stdout:
            ready = parse_ready_line(line.strip())
            if ready is not None:
                break
            if time.monotonic() - started > timeout_seconds:
                self.stop()
                raise EngineStartError(
                    f"the engine was not ready after {timeout_seconds:.0f} s{self._where()}"
                )
        if ready is None:
            code = self.process.wait()
            self.stop()
            raise EngineStartError(
                f"the embedded engine exited with status {code} before it was ready"
                + (self._where() or "; its log above says why")
            )
        # Keep reading so the child never blocks on a full stdout pipe.
        self._stdout_drain = threading.Thread(target=self._drain, daemon=True)
        self._stdout_drain.start()
        log.info(
            "embedded engine ready at %s (model %s) after %.1f s",
            ready.base_url,
            ready.model,
            time.monotonic() - started,
        )
        return ready

    def _drain(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for _ in self.process.stdout:
            pass

    def _where(self) -> str:
        """The end of the log file, for errors (empty when logging to stderr)."""
        if self.log_path is None:
            return ""
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return f"; the end of its log ({self.log_path}):\n" + "\n".join(lines[-15:])

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process is not None and process.stdout is not None:
            # The drain thread sees EOF once the child is gone; then the pipe can close.
            if self._stdout_drain is not None:
                self._stdout_drain.join(timeout=5)
            if self._stdout_drain is None or not self._stdout_drain.is_alive():
                process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


def engine_options(config: UpstreamConfig) -> EngineOptions:
    """The engine options a ``type: local`` upstream's settings ask for."""
    return EngineOptions(
        threads=config.threads,
        dtype=config.dtype,
        prefix_cache_mb=config.prefix_cache_mb,
        backend=config.backend,
    )


def start_local_upstreams(
    upstreams: dict[str, UpstreamConfig], home: Path
) -> tuple[dict[str, UpstreamConfig], list[LocalEngine]]:
    """Start one engine per ``type: local`` upstream and return the upstreams rewritten
    as OpenAI-compatible ones pointing at them. ``model`` of a local upstream names the
    engine's model source (default ``smollm2-135m``)."""
    engines: list[LocalEngine] = []
    resolved: dict[str, UpstreamConfig] = {}
    try:
        for name, config in upstreams.items():
            if config.type != "local":
                resolved[name] = config
                continue
            options = engine_options(config)
            engine = LocalEngine(name, config.model or DEFAULT_LOCAL_MODEL, home, options=options)
            engines.append(engine)
            ready = engine.start()
            resolved[name] = config.model_copy(
                update={"type": "openai", "base_url": ready.base_url, "model": ready.model}
            )
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return resolved, engines
