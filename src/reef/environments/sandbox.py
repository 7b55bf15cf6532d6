"""Running a toolset's code in a child process: ``ToolWorker`` and ``SandboxConfig``.

One worker serves one episode: it imports the toolset in the child (so none of the
toolset's code runs in Reef's process), keeps the toolset's state across the
episode's calls, and is killed and started again when a call outlives its time or the
child dies. The child runs ``worker_main.py`` by path, under resource limits
(``RLIMIT_AS`` for memory, ``RLIMIT_CPU`` for CPU time over the episode, on Linux and
other POSIX systems) and, unless ``network: true``, with the network denied by an audit
hook — best-effort, see ``worker_main``. It runs in a session of its own, so a kill
reaches whatever it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reef.environments.base import EpisodeError, ToolCrashed

WORKER_SCRIPT = Path(__file__).with_name("worker_main.py")
_STDERR_TAIL = 2000


class SandboxConfig(BaseModel):
    """Limits of a tool worker (``sandbox:`` in a spec): address space in MiB
    (``memory_mb``), CPU seconds over the episode (``cpu_seconds``), whether its code
    may use the network (``network``, off by default) and the environment variables it
    may see besides PATH, HOME, the locale and TMPDIR (``pass_env``). None lifts a
    limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int | None = Field(default=1024, ge=64)
    cpu_seconds: int | None = Field(default=60, ge=1)
    network: bool = False
    pass_env: tuple[str, ...] = ()


# What the child's environment holds besides ``pass_env``: none of Reef's keys or the
# upstream's secrets reach a toolset unless a spec names them.
_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SYSTEMROOT")


def child_environment(pass_env: tuple[str, ...]) -> dict[str, str]:
    """The environment variables a tool worker starts with."""
    names = (*_BASE_ENV, *pass_env)
    return {name: os.environ[name] for name in names if name in os.environ}


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
        # A JSON line holds at most max_output_chars characters of output, each at most
        # 6 bytes escaped, plus the envelope.
        limit = 6 * self.max_output_chars + 65536
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,  # our own interpreter running our own script: no shell, no input
            str(WORKER_SCRIPT),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=child_environment(self.sandbox.pass_env),
            limit=limit,
        )
        assert self._process.stderr is not None
        self._drain = asyncio.create_task(self._keep_stderr(self._process.stderr))
        init = {
            "op": "init",
            "module": self.module,
            "sys_path": [path for path in sys.path if path],
            "memory_mb": self.sandbox.memory_mb,
            "cpu_seconds": self.sandbox.cpu_seconds,
            "network": self.sandbox.network,
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
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (its CPU time limit?)" if -code in (signal.SIGXCPU, signal.SIGKILL) else ""
            how = f"was killed by {name}{hint}"
        else:
            how = f"exited with code {code}"
        tail = self._stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        said = f"; its last words: {' | '.join(tail)}" if tail else ""
        return f"the tool worker {how}{said}"
