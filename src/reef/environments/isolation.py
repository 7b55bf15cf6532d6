"""The OS boundary around a tool worker: bubblewrap (``bwrap``) where it runs, else none.

``tool_isolation()`` says, once per process, whether ``bwrap`` can start a sandbox
here (it starts one: the interpreter running ``worker_main.py --probe``); the answer
is cached. ``bwrap_arguments`` builds the command line of one worker's sandbox:

- the filesystem is a fresh tmpfs holding only what the worker needs, read-only: the
  system directories (``/usr`` and the ``/lib``/``/bin`` links), a few files of
  ``/etc``, the Python installation (``sys.prefix`` and ``sys.base_prefix``), the
  import path's directories, the toolset's own package and ``worker_main.py``;
- the current directory, the user's home and the paths given to ``hide_from_tools``
  (Reef's home, its database, the config file) are covered by an empty tmpfs (a file
  by ``/dev/null``) wherever they lie under a bound directory, so neither
  ``reef.yaml`` nor ``.reef/reef.db`` is ever visible; a path bound deeper (the
  toolset inside the project directory) shows again;
- ``/tmp`` is a private tmpfs (``HOME`` and ``TMPDIR`` point there), ``/dev`` and
  ``/proc`` are the sandbox's own;
- new PID, IPC, UTS and (unless the environment allows it) network namespaces, a new
  session, and ``--die-with-parent``.

RLIMIT_NPROC only holds for a user that is not root, so when Reef runs as root the
sandbox keeps CAP_SETUID/CAP_SETGID only and the worker drops at once to a uid and
gid of its own (``--run-as``), never shared with another worker; otherwise ``bwrap``
runs in a new user namespace, where the kernel counts processes per namespace.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger("reef.environments")

WORKER_SCRIPT = Path(__file__).with_name("worker_main.py")
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt install bubblewrap; Fedora: dnf install "
    "bubblewrap) and allow unprivileged user namespaces"
)
SANDBOX_TMP = "/tmp"  # noqa: S108 (the sandbox's own private tmpfs, not the host's /tmp)
_PROBE_SECONDS = 30.0
# Where the worker runs as root, the uids it drops to: a range no real account uses.
_UID_BASE = 2_000_000_000
_UID_SPAN = 100_000_000
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
_ETC_NETWORK = (
    "resolv.conf",
    "hosts",
    "nsswitch.conf",
    "gai.conf",
    "host.conf",
    "services",
    "protocols",
    "ssl",
    "ca-certificates",
    "pki",
)
_hidden: set[Path] = set()


@dataclass(frozen=True)
class Boundary:
    """What isolates a tool worker: ``bwrap`` (``detail``: the program) or ``none``
    (``detail``: why not, and what to install)."""

    kind: Literal["bwrap", "none"]
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """The JSON form ``/reef/status`` shows under ``tool_isolation``."""
        return {"boundary": self.kind, "detail": self.detail}


def hide_from_tools(*paths: str | Path) -> None:
    """Never show ``paths`` (Reef's home, its database, its config) inside a tool
    worker's sandbox, even where they lie under a directory it binds."""
    _hidden.update(Path(path).absolute() for path in paths)


def sandbox_uid() -> int | None:
    """The uid a worker drops to when Reef runs as root (one per worker, so the
    process limit counts that worker's processes alone); None otherwise."""
    if os.geteuid() != 0:
        return None
    return _UID_BASE + secrets.randbelow(_UID_SPAN)


@functools.cache
def tool_isolation() -> Boundary:
    """The boundary tool workers get on this machine: ``bwrap`` if it starts a sandbox
    here, else ``none`` with the reason. Probed once per process (``cache_clear``
    probes again)."""
    if not sys.platform.startswith("linux"):
        return Boundary("none", f"bubblewrap needs Linux, this is {sys.platform}")
    program = shutil.which("bwrap")
    if program is None:
        return Boundary("none", f"bwrap is not installed (not on PATH); {INSTALL_HINT}")
    uid = sandbox_uid()
    command = bwrap_arguments(program, runtime_paths(), network=False, tmp_mb=16)
    command += [sys.executable, str(WORKER_SCRIPT), "--probe", *run_as(uid)]
    try:
        done = subprocess.run(  # noqa: S603 (bwrap found on PATH, our own interpreter and script)
            command, capture_output=True, timeout=_PROBE_SECONDS, env={}, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return Boundary("none", f"{program} failed to start a sandbox: {error}; {INSTALL_HINT}")
    if done.returncode != 0 or done.stdout.strip() != b"ok":
        said = done.stderr.decode(errors="replace").strip().splitlines()[-2:]
        why = " | ".join(said) or f"exit status {done.returncode}"
        return Boundary("none", f"{program} cannot start a sandbox here ({why}); {INSTALL_HINT}")
    return Boundary("bwrap", program)


def log_tool_isolation() -> Boundary:
    """Probe, and say at start-up when the python environment's tools would run
    without an OS boundary."""
    boundary = tool_isolation()
    if boundary.kind == "none":
        log.warning(
            "tools of python environments will run without an OS boundary (only resource "
            "limits and an audit hook, which does not stop file reads or a C extension): %s",
            boundary.detail,
        )
    return boundary


def run_as(uid: int | None) -> list[str]:
    """The worker's arguments that make it drop to ``uid`` (nothing for None)."""
    return [] if uid is None else ["--run-as", str(uid)]


def runtime_paths() -> list[str]:
    """What any worker reads: the Python installation and ``worker_main.py``."""
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    return [*sorted(prefixes), str(WORKER_SCRIPT)]


def toolset_paths(module: str, import_path: Iterable[str]) -> list[str]:
    """What a toolset's worker reads besides the runtime: the import path's entries and
    where the top-level package of ``module`` lies (found without importing it)."""
    import importlib.util

    paths = [path for path in import_path if path]
    spec = importlib.util.find_spec(module.partition(".")[0])
    if spec is not None:
        if spec.submodule_search_locations:
            paths.extend(spec.submodule_search_locations)
        elif spec.origin and os.path.isabs(spec.origin):
            paths.append(spec.origin)
    return paths


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _protected() -> list[str]:
    """The paths no sandbox shows: the current directory, the home, the hidden ones."""
    found = {Path.cwd(), *_hidden}
    with contextlib.suppress(RuntimeError, KeyError):  # no home known for this user
        found.add(Path.home())
    return sorted(os.path.realpath(path) for path in found if path.exists())


def _system_arguments(network: bool) -> list[str]:
    """The system directories (links recreated as links) and ``/etc``'s few files."""
    arguments: list[str] = []
    for directory in _SYSTEM_DIRS:
        if os.path.islink(directory):  # merged /usr: /lib -> usr/lib
            arguments += ["--symlink", os.readlink(directory), directory]
    for name in (*_ETC, *(_ETC_NETWORK if network else ())):
        arguments += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return arguments


def _mounts(read_only: Sequence[str]) -> list[str]:
    """Read-only binds of ``read_only`` and masks of the protected paths under them,
    shallowest first, so a mask covers its bind and a deeper bind shows again."""
    binds = {os.path.realpath(path) for path in read_only if os.path.exists(path)}
    binds |= {path for path in _SYSTEM_DIRS if os.path.isdir(path) and not os.path.islink(path)}
    protected = _protected()
    binds -= {*protected, "/", SANDBOX_TMP}  # never a protected path, the root or /tmp
    binds = {path for path in binds if not _under(path, "/dev") and not _under(path, "/proc")}
    masks = {path for path in protected if any(_under(path, bind) for bind in binds)}
    steps = sorted([(_depth(path), False, path) for path in binds])
    steps = sorted(steps + [(_depth(path), True, path) for path in masks])
    arguments: list[str] = []
    shown = [(SANDBOX_TMP, True)]  # what is mounted so far, and whether a tmpfs
    made: set[str] = set()
    for _, is_mask, path in steps:
        if is_mask:  # a directory by an empty tmpfs, a file by an empty file
            directory = os.path.isdir(path)
            arguments += ["--tmpfs", path] if directory else ["--ro-bind", os.devnull, path]
        else:
            arguments += [*_parents(path, shown, made), "--ro-bind", path, path]
        shown.append((path, is_mask))
    return arguments


def _parents(path: str, shown: list[tuple[str, bool]], made: set[str]) -> list[str]:
    """``--dir`` with mode 0755 for each ancestor of ``path`` that lies on a tmpfs (the
    sandbox's root or a mask), which bwrap would otherwise make 0700: unreadable to a
    worker that dropped to a uid of its own."""
    arguments: list[str] = []
    for ancestor in reversed(Path(path).parents):
        parent = str(ancestor)
        if parent == "/" or parent in made:
            continue
        holders = [(where, mask) for where, mask in shown if _under(parent, where)]
        deepest = max(holders, key=lambda holder: _depth(holder[0]), default=None)
        if deepest is None or (deepest[1] and deepest[0] != parent):
            arguments += ["--perms", "0755", "--dir", parent]
            made.add(parent)
    return arguments


def bwrap_arguments(
    program: str, read_only: Sequence[str], network: bool, tmp_mb: int | None
) -> list[str]:
    """The ``bwrap`` command line (before the command) of a sandbox that can read
    ``read_only`` (see the module docstring)."""
    arguments = [program, "--die-with-parent", "--new-session", "--unshare-pid"]
    arguments += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        arguments.append("--unshare-net")
    if os.geteuid() == 0:
        arguments += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        arguments.append("--unshare-user")
    arguments += ["--dev", "/dev", "--proc", "/proc"]
    if tmp_mb is not None:
        arguments += ["--size", str(tmp_mb * 1024 * 1024)]
    arguments += ["--perms", "1777", "--tmpfs", SANDBOX_TMP]
    arguments += _system_arguments(network)
    arguments += _mounts(read_only)
    arguments += ["--chdir", SANDBOX_TMP]
    return arguments
