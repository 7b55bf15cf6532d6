"""Running a toolset's code in a child process: ``ToolWorker`` and ``SandboxConfig``.

One worker serves one episode: it imports the toolset in the child (so none of the
toolset's code runs in Reef's process), keeps the toolset's state across the
episode's calls, and is killed and started again when a call outlives its time or the
child dies. The child runs ``worker_main.py`` by path, inside the OS boundary
``isolation`` finds (bubblewrap where it runs: a read-only view of the Python
installation and the toolset, a private ``/tmp``, no network, its own PID namespace),
under resource limits (``RLIMIT_AS`` for memory, ``RLIMIT_CPU`` for CPU time over the
episode, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE`` and, inside a boundary, ``RLIMIT_NPROC``)
and, unless ``network: true``, with an audit hook refusing the network and new
processes (best-effort, see ``worker_main``). It runs in a session of its own, so a
kill reaches whatever it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reef.environments.base import EpisodeError, ToolCrashed
from reef.environments.isolation import (
    SANDBOX_TMP,
    WORKER_SCRIPT,
    Boundary,
    bwrap_arguments,
    run_as,
    runtime_paths,
    sandbox_uid,
    tool_isolation,
    toolset_paths,
)

__all__ = ["WORKER_SCRIPT", "SandboxConfig", "ToolWorker", "WorkerFailed", "child_environment"]

log = logging.getLogger("reef.environments")
_STDERR_TAIL = 2000


class SandboxConfig(BaseModel):
    """Limits of a tool worker (``sandbox:`` in a spec): the OS boundary
    (``isolation``), address space in MiB (``memory_mb``), CPU seconds over the episode
    (``cpu_seconds``), the largest file it may write (``file_size_mb``), open files
    (``open_files``), processes and threads inside a boundary (``processes``), the size
    of its private ``/tmp`` (``tmp_mb``), more paths it may read (``read_paths``),
    whether its code may use the network (``network``, off by default) and the
    environment variables it may see besides PATH, HOME, the locale and TMPDIR
    (``pass_env``). None lifts a limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    isolation: Literal["auto", "bwrap", "none"] = Field(
        default="auto",
        description="auto: bubblewrap where it runs, else none (with a warning); bwrap: "
        "require it (an episode fails to start without it); none: no OS boundary.",
    )
    memory_mb: int | None = Field(default=1024, ge=64, description="RLIMIT_AS in MiB.")
    cpu_seconds: int | None = Field(
        default=60, ge=1, description="RLIMIT_CPU: CPU seconds over the episode."
    )
    file_size_mb: int | None = Field(
        default=64, ge=1, description="RLIMIT_FSIZE: the largest file a tool may write, MiB."
    )
    open_files: int | None = Field(
        default=256, ge=16, description="RLIMIT_NOFILE: file descriptors open at once."
    )
    processes: int | None = Field(
        default=64,
        ge=4,
        description="RLIMIT_NPROC inside a boundary: processes and threads of the worker, "
        "itself included (without a boundary it would count all of Reef's user's).",
    )
    tmp_mb: int | None = Field(
        default=256, ge=1, description="Size of the private /tmp inside a boundary, MiB."
    )
    read_paths: tuple[str, ...] = Field(
        default=(),
        description="More paths the worker may read inside a boundary (data files, "
        "modules outside the toolset's package); never Reef's home or the current directory.",
    )
    network: bool = Field(default=False, description="Let the tools use the network.")
    pass_env: tuple[str, ...] = Field(
        default=(), description="Environment variables passed to the worker by name."
    )


# What the child's environment holds besides ``pass_env``: none of Reef's keys or the
# upstream's secrets reach a toolset unless a spec names them.
_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SYSTEMROOT")


def child_environment(pass_env: tuple[str, ...]) -> dict[str, str]:
    """The environment variables a tool worker starts with."""
    names = (*_BASE_ENV, *pass_env)
    return {name: os.environ[name] for name in names if name in os.environ}


def import_path() -> list[str]:
    """Reef's import path for the worker, absolute: inside a boundary the worker's
    current directory is its own ``/tmp``."""
    return [os.path.abspath(path) for path in sys.path if path]


class WorkerFailed(ToolCrashed):
    """The worker died, broke the protocol or was killed."""


class ToolWorker:
    """The child process running the toolset ``module`` (see the module docstring).

    ``start`` spawns it and returns the tools' specs; ``request`` sends one message and
    waits for its answer (a cancelled wait kills the child);
    ``close`` ends it. Not safe for concurrent requests: an episode's calls run one by
    one.
    """

    def __init__(self, module: str, sandbox: SandboxConfig, max_output_chars: int) -> None:
        self.module = module
        self.sandbox = sandbox
        self.max_output_chars = max_output_chars
        self._process: asyncio.subprocess.Process | None = None
        self._stderr: bytearray = bytearray()
        self._drain: asyncio.Task[None] | None = None
        self.scores = False  # whether the toolset has its own score(), once started
        self.boundary: Boundary | None = None  # what isolates the child, once started

    @property
    def running(self) -> bool:
        """Whether a child is alive."""
        return self._process is not None and self._process.returncode is None

    async def start(self, seconds: float) -> list[dict[str, Any]]:
        """Spawn the child and load the toolset within ``seconds``; the tools' specs.
        Raises ``EpisodeError`` when the toolset fails to load or the child does not
        answer in time."""
        await self.close()
        self._stderr = bytearray()
        self.boundary = boundary = await self._boundary()
        env = child_environment(self.sandbox.pass_env)
        if boundary.kind == "bwrap":
            env.update(HOME=SANDBOX_TMP, TMPDIR=SANDBOX_TMP)
        # A JSON line holds at most max_output_chars characters of output, each at most
        # 6 bytes escaped, plus the envelope.
        limit = 6 * self.max_output_chars + 65536
        self._process = await asyncio.create_subprocess_exec(
            *self._command(boundary),  # bwrap, our own interpreter and script: no shell
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=env,
            limit=limit,
        )
        assert self._process.stderr is not None
        self._drain = asyncio.create_task(self._keep_stderr(self._process.stderr))
        sandbox = self.sandbox
        init = {
            "op": "init",
            "module": self.module,
            "sys_path": import_path(),
            "memory_mb": sandbox.memory_mb,
            "cpu_seconds": sandbox.cpu_seconds,
            "file_size_mb": sandbox.file_size_mb,
            "open_files": sandbox.open_files,
            # Without a namespace the count would be every process of Reef's user.
            "processes": sandbox.processes if boundary.kind == "bwrap" else None,
            "network": sandbox.network,
            "max_output_chars": self.max_output_chars,
        }
        try:
            async with asyncio.timeout(seconds):
                answer = await self.request(init)
        except (WorkerFailed, TimeoutError) as error:
            await self.close()
            raise EpisodeError(f"the tools of {self.module!r} did not start: {error}") from error
        if not answer.get("ok"):
            await self.close()
            raise EpisodeError(
                f"the tools of {self.module!r} failed to load: {answer.get('error')}"
            )
        self.scores = bool(answer.get("scores"))
        return list(answer["tools"])

    async def _boundary(self) -> Boundary:
        """The boundary ``sandbox.isolation`` asks for, as this machine allows. Raises
        ``EpisodeError`` when ``bwrap`` is required and cannot run here."""
        isolation = self.sandbox.isolation
        if isolation == "none":
            return Boundary("none", "sandbox.isolation is none")
        found = await asyncio.to_thread(tool_isolation)
        if found.kind == "none":
            if isolation == "bwrap":
                raise EpisodeError(
                    f"the tools of {self.module!r} need sandbox.isolation: bwrap, but no "
                    f"sandbox can start here: {found.detail} (or set sandbox.isolation: auto)"
                )
            _warn_once(found)
        return found

    def _command(self, boundary: Boundary) -> list[str]:
        """The child's command line: the worker script, inside ``bwrap`` when it runs."""
        worker = [sys.executable, str(WORKER_SCRIPT)]
        if boundary.kind == "none":
            return worker
        paths = [
            *runtime_paths(),
            *toolset_paths(self.module, sys.path),
            *self.sandbox.read_paths,
        ]
        sandbox = bwrap_arguments(boundary.detail, paths, self.sandbox.network, self.sandbox.tmp_mb)
        return [*sandbox, *worker, *run_as(sandbox_uid())]

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` and return the answer; bound it with ``asyncio.timeout``: a
        cancelled request (a timeout's) kills the child, which must not outlive a call
        it is still running. Raises ``WorkerFailed`` when the child is gone or answers
        garbage."""
        process = self._process
        if process is None or process.returncode is not None:
            raise WorkerFailed("the tool worker is not running")
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write((json.dumps(message, default=str) + "\n").encode())
            await process.stdin.drain()
            line = await process.stdout.readline()
        except asyncio.CancelledError:
            await self.close()
            raise
        except (ConnectionError, ValueError) as error:  # a closed pipe, an oversized line
            await self.close()
            raise WorkerFailed(f"the tool worker broke its protocol: {error}") from error
        if not line:
            raise WorkerFailed(await self._death())
        try:
            answer = json.loads(line)
        except ValueError as error:
            await self.close()
            raise WorkerFailed(
                f"the tool worker answered something not JSON: {line[:200]!r}"
            ) from error
        if not isinstance(answer, dict):
            await self.close()
            raise WorkerFailed(f"the tool worker answered {type(answer).__name__}, not an object")
        return answer

    async def close(self) -> None:
        """Kill the child (and everything in its session) and reap it."""
        process, self._process = self._process, None
        if process is not None:
            # The whole session: a dead worker's children may still hold its pipes.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        if self._drain is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            self._drain = None

    async def _keep_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._stderr += chunk
            del self._stderr[:-_STDERR_TAIL]

    async def _death(self) -> str:
        """Why the child is gone: its exit status and the tail of its stderr."""
        process = self._process
        assert process is not None
        code = await process.wait()
        await self.close()
        bwrap = self.boundary is not None and self.boundary.kind == "bwrap"
        if bwrap and code > 128 and code - 128 in signal.valid_signals():
            code = 128 - code  # bwrap passes a death by signal on as 128 + its number
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (its CPU time limit?)" if -code in (signal.SIGXCPU, signal.SIGKILL) else ""
            how = f"was killed by {name}{hint}"
        else:
            how = f"exited with code {code}"
        tail = self._stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        said = f"; its last words: {' | '.join(tail)}" if tail else ""
        return f"the tool worker {how}{said}"


_warned: set[str] = set()


def _warn_once(boundary: Boundary) -> None:
    """Log, once per process, that tool workers run without an OS boundary."""
    if boundary.detail not in _warned:
        _warned.add(boundary.detail)
        log.warning(
            "python environment tools run without an OS boundary (sandbox.isolation: auto "
            "found none): %s",
            boundary.detail,
        )
