"""Running a training function in a child process, so that a crash there (an
exception, out of memory, a segfault, SIGKILL) fails one job and never the worker.
Torch-free: the parent imports only this.

The child is ``python -m reef.learning.trainers METHOD SPEC.json`` (METHOD ``sft``,
``preference`` or ``rl``). It prints protocol
lines to stdout, each ``REEF_TRAIN {json}``: ``{"event": "progress", "step", "steps",
"loss"}`` after every optimizer step and one ``{"event": "result", "result": {...}}``
at the end. Everything else it writes (logs, warnings, tracebacks) goes to
``train.log`` in the work directory, whose tail a failure carries.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from reef.learning.trainers.spec import (
    PreferenceSpec,
    ProgressCallback,
    RLSpec,
    SFTSpec,
    TrainingFailedError,
    TrainResult,
)

PROTOCOL_PREFIX = "REEF_TRAIN "
LOG_TAIL_LINES = 40


def protocol_line(event: str, **payload: Any) -> str:
    """One protocol line (no newline), as the child prints it."""
    return PROTOCOL_PREFIX + json.dumps({"event": event, **payload}, default=str)


def child_command(spec_path: Path, method: str = "sft") -> list[str]:
    """argv of the training child for a spec file, tied to this process's life."""
    return [
        sys.executable,
        "-m",
        "reef.learning.trainers",
        method,
        str(spec_path),
        "--parent-pid",
        str(os.getpid()),
    ]


def _method(spec: SFTSpec | PreferenceSpec | RLSpec) -> str:
    if isinstance(spec, PreferenceSpec):
        return "preference"
    if isinstance(spec, RLSpec):
        return "rl"
    return "sft"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _tail(log_path: Path) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def _describe(status: int | None) -> str:
    if status is None:
        return "timed out"
    if status < 0:
        return f"was killed by signal {-status}"
    return f"exited with status {status}"


def run_in_child(
    spec: SFTSpec | PreferenceSpec | RLSpec,
    on_progress: ProgressCallback | None = None,
    *,
    work_dir: Path | None = None,
    timeout_seconds: float | None = None,
) -> TrainResult:
    """Run ``train_lora_sft(spec)`` (an ``SFTSpec``), ``train_preference(spec)`` (a
    ``PreferenceSpec``) or ``train_grpo(spec)`` (an ``RLSpec``) in a fresh child process
    and return its result.

    ``work_dir`` receives ``spec.json`` and ``train.log`` (a temporary directory when
    None). Raises ``TrainingFailedError`` (exit status, log tail) when the child fails,
    dies by a signal, outlives ``timeout_seconds`` (it is killed) or answers nothing.
    An exception raised by ``on_progress`` kills the child and propagates: that is how
    a caller cancels a run.
    """
    work = work_dir or Path(tempfile.mkdtemp(prefix="reef-train-"))
    work.mkdir(parents=True, exist_ok=True)
    spec_path, log_path = work / "spec.json", work / "train.log"
    spec_path.write_text(spec.model_dump_json(indent=2), encoding="utf-8")
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    result: TrainResult | None = None
    with log_path.open("a", encoding="utf-8") as log:
        child = subprocess.Popen(  # noqa: S603 (argv of our own interpreter, no shell)
            child_command(spec_path, _method(spec)),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=_child_env(),
        )
        assert child.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(child.stdout, lines), daemon=True)
        reader.start()
        timed_out = False
        try:
            result = _follow(lines, log, on_progress, deadline)
        except TimeoutError:
            timed_out = True
            child.kill()
        except BaseException:
            child.kill()  # the caller's thread was interrupted: the child must not outlive it
            raise
        finally:
            status = child.wait()
            reader.join()
            child.stdout.close()
    if timed_out:
        raise TrainingFailedError(
            f"training child timed out after {timeout_seconds} s (log: {log_path})",
            None,
            _tail(log_path),
        )
    if status != 0 or result is None:
        raise TrainingFailedError(
            f"training child {_describe(status)} (log: {log_path})", status, _tail(log_path)
        )
    return result


def _follow(
    lines: queue.Queue[str | None],
    log: IO[str],
    on_progress: ProgressCallback | None,
    deadline: float | None,
) -> TrainResult | None:
    """Read the child's stdout until it closes; forward progress, return the result."""
    result: TrainResult | None = None
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            line = lines.get(timeout=wait)
        except queue.Empty:
            raise TimeoutError from None
        if line is None:
            return result
        if not line.startswith(PROTOCOL_PREFIX):
            log.write(line)
            log.flush()
            continue
        message = json.loads(line[len(PROTOCOL_PREFIX) :])
        if message["event"] == "progress" and on_progress is not None:
            on_progress(int(message["step"]), int(message["steps"]), float(message["loss"]))
        elif message["event"] == "result":
            result = TrainResult.model_validate(message["result"])
