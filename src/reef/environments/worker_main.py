"""The tool worker: the child process that runs a toolset's functions (``ToolWorker``
in ``sandbox`` starts it by path, so it imports nothing of reef; standard library only).

Protocol: JSON lines. The first line from the parent is ``{"op": "init", ...}`` naming
the toolset module, the import path and the limits; the worker applies the limits,
denies the network, imports the module and answers with the tools' specs. Then each
line is ``reset`` (a task), ``call`` (a tool and its arguments) or ``score`` (a task
and the conversation) and gets one answer line. Whatever a tool prints goes to stderr,
so it cannot corrupt the protocol.

The audit hook is best-effort: it (PEP 578) refuses socket connects, binds, sends and
name lookups, process creation and ``ctypes`` (which could call the C library
directly). It does not stop reading files, and code that reaches the kernel another
way (a C extension of its own, ``_posixsubprocess``, a patched ``subprocess``) passes
it. The real boundary is the sandbox ``isolation`` starts the worker in (bubblewrap:
no network, a read-only view of the Python installation and the toolset only), with
the limits applied here; ``--run-as UID`` (given when Reef runs as root) makes the
worker drop to that uid and gid first, so the process limit holds. ``--probe`` only
answers ``ok`` (after the drop): the parent's check that a sandbox starts.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import traceback
import typing
from collections.abc import Callable
from typing import Any

_DENIED_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
        "ctypes.dlopen",
        "ctypes.dlsym",
    }
)
_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _deny_network() -> None:
    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in _DENIED_EVENTS:
            raise PermissionError(
                f"{event} is not allowed: this environment's tools have no network"
            )

    sys.addaudithook(hook)


def _apply_limits(init: dict[str, Any]) -> None:
    """The rlimits of the init message: address space and largest file in MiB, CPU
    seconds, open files, processes (and threads) of the worker's uid. None: no limit."""
    import resource

    mib = 1024 * 1024
    limits = {
        resource.RLIMIT_AS: _scaled(init.get("memory_mb"), mib),
        resource.RLIMIT_FSIZE: _scaled(init.get("file_size_mb"), mib),
        resource.RLIMIT_NOFILE: init.get("open_files"),
        resource.RLIMIT_NPROC: init.get("processes"),
    }
    for kind, value in limits.items():
        if value is not None:
            hard = resource.getrlimit(kind)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(kind, (value, value))
    cpu_seconds = init.get("cpu_seconds")
    if cpu_seconds is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


def _scaled(value: int | None, unit: int) -> int | None:
    return None if value is None else value * unit


def _drop_to(uid: int) -> None:
    """Become ``uid`` (and gid ``uid``) with no supplementary groups, for good: the
    sandbox left the worker CAP_SETUID and CAP_SETGID only for this."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def tool_spec(function: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool spec of ``function``: its name, its docstring's first paragraph
    and parameters from its signature (type hints give JSON types; a parameter without
    a default is required)."""
    hints = typing.get_type_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(function).parameters.items():
        kind = _JSON_TYPES.get(typing.get_origin(hints.get(name)) or hints.get(name))
        properties[name] = {"type": kind} if kind else {}
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
    doc = inspect.getdoc(function) or ""
    return {
        "type": "function",
        "function": {
            "name": function.__name__,
            "description": doc.split("\n\n")[0].replace("\n", " "),
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


def _load(name: str) -> Any:
    """The module ``name``, loaded from its file without running its parent packages'
    ``__init__`` (a toolset inside a big package should not import all of it); a
    module that is not a plain file under its top-level package is imported as usual."""
    import importlib
    import importlib.util

    top, _, rest = name.partition(".")
    spec = importlib.util.find_spec(top)
    locations = list(spec.submodule_search_locations or ()) if spec else []
    if rest and locations:
        for location in locations:
            base = os.path.join(location, *rest.split("."))
            for path in (base + ".py", os.path.join(base, "__init__.py")):
                if os.path.isfile(path):
                    found = importlib.util.spec_from_file_location(name, path)
                    if found is not None and found.loader is not None:
                        module = importlib.util.module_from_spec(found)
                        sys.modules[name] = module
                        found.loader.exec_module(module)
                        return module
    return importlib.import_module(name)


class _Worker:
    def __init__(self, module: Any, max_output_chars: int) -> None:
        self.tools: dict[str, Callable[..., Any]] = {f.__name__: f for f in module.TOOLS}
        self.reset_hook = getattr(module, "reset", None)
        self.score_hook = getattr(module, "score", None)
        self.max_output_chars = max_output_chars

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "reset":
            if self.reset_hook is not None:
                self.reset_hook(request["task"])
            return {"ok": True}
        if op == "call":
            output = self.tools[request["name"]](**request["arguments"])
            text = output if isinstance(output, str) else json.dumps(output, default=str)
            # Cut here too, so a huge output never crosses the pipe (the parent marks it).
            return {"ok": True, "content": text[: self.max_output_chars], "chars": len(text)}
        if op == "score":
            if self.score_hook is None:
                return {"ok": True, "absent": True}
            value, reason = self.score_hook(request["task"], request["messages"])
            return {"ok": True, "score": float(value), "reason": str(reason)}
        return {"ok": False, "error": f"unknown op {op!r}"}


def _describe(error: BaseException, origin: str | None = None) -> str:
    """The error, and where in the toolset (the file ``origin``) it was raised."""
    stack = traceback.extract_tb(error.__traceback__)
    frames = [f for f in stack if f.filename == origin] or list(stack)
    where = f" (at {frames[-1].name}, line {frames[-1].lineno})" if frames else ""
    text = str(error)
    text = text if len(text) <= 2000 else text[:2000] + "..."
    return f"{type(error).__name__}: {text}{where}"


def main() -> None:
    """Serve the protocol on the process's stdin and stdout until stdin closes."""
    arguments = sys.argv[1:]
    if "--run-as" in arguments:
        _drop_to(int(arguments[arguments.index("--run-as") + 1]))
    if "--probe" in arguments:  # the interpreter and its standard library work here
        import resource  # noqa: F401 (a C extension, from the library's own directory)

        print("ok" if os.listdir(os.path.dirname(os.__file__)) else "empty")
        return
    proto_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    proto_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # a tool's print() lands on stderr
    sys.stdout = sys.stderr

    def send(message: dict[str, Any]) -> None:
        proto_out.write(json.dumps(message, ensure_ascii=False, default=str) + "\n")
        proto_out.flush()

    init = json.loads(proto_in.readline())
    try:
        sys.path[:] = init["sys_path"]
        _apply_limits(init)
        if not init.get("network", False):
            _deny_network()
        module = _load(init["module"])
        worker = _Worker(module, int(init["max_output_chars"]))
        specs = [tool_spec(function) for function in worker.tools.values()]
    except BaseException as error:  # the parent reports it: the toolset cannot load
        send({"ok": False, "error": _describe(error)})
        return
    send({"ok": True, "tools": specs, "scores": worker.score_hook is not None})
    for line in proto_in:
        try:
            answer = worker.handle(json.loads(line))
        except Exception as error:  # a tool's failure is its result, not the worker's end
            answer = {"ok": False, "error": _describe(error, getattr(module, "__file__", None))}
        send(answer)


if __name__ == "__main__":
    main()
