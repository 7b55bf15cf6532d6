"""Running a training function as a Ray task (``trainer: ray``), the counterpart of
:func:`reef.learning.trainers.runner.run_in_child`.

The task runs the same function (``train_lora_sft``, ``train_preference`` or
``train_grpo``) with the same spec and answers the same ``TrainResult``. Files travel as
bytes, so nothing assumes a shared filesystem for them: the base adapter (when any) goes
to the task as ``{relative path: bytes}``, the task trains into a temporary directory on
its node and returns the adapter the same way, and the caller writes it to
``spec.output_dir``. A ``full`` SFT run works the same: the checkpoint it continues from
(``spec.model`` as a directory) travels as bytes, and the checkpoint it trains comes
back as bytes (held in memory whole: fine for small models; a large model's run wants
storage both sides reach, not yet wired). An RL run's environment tasks file travels the
same way; its environment's tools (a ``python`` toolset, an ``http`` service) must be
reachable from the worker.
What a real cluster must still provide: ``reef`` (and torch) importable on the worker
nodes, and the model under ``spec.home`` there (the engine loads it offline).

``ray`` is imported lazily (the optional ``ray`` extra). With ``address`` None a local
cluster starts on loopback (``127.0.0.1``, no dashboard) and stops when the last run
that needed it ends; an already initialised Ray is used and left running.
Progress is not streamed: ``on_progress`` receives every step's loss once the task has
finished (an exception it raises still discards the run).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from reef.core.errors import optional_dependency
from reef.learning.trainers import ProgressCallback
from reef.learning.trainers.spec import (
    PreferenceSpec,
    RLSpec,
    SFTSpec,
    TrainingFailedError,
    TrainResult,
)

POLL_SECONDS = 0.5

_lock = threading.Lock()
_users = 0  # runs using a local cluster this module started
_started = False


def read_tree(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` as ``{relative posix path: bytes}``."""
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def write_tree(files: dict[str, bytes], directory: Path) -> None:
    """Write ``files`` (from :func:`read_tree`) under ``directory``, which must stay
    their root: a path escaping it raises ``TrainingFailedError``."""
    root = directory.resolve()
    for name, data in files.items():
        target = (root / name).resolve()
        if not target.is_relative_to(root) or target == root:
            raise TrainingFailedError(f"ray task returned a path outside the adapter: {name!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def train_task(
    spec_json: str,
    method: str,
    base_files: dict[str, bytes] | None,
    tasks_file: bytes | None,
) -> tuple[str, dict[str, bytes]]:
    """The body of the Ray task (runs on a worker): train with the spec, answer the
    result as JSON and the adapter's files. Torch loads here only. ``tasks_file``: the
    tasks of an RL run's environment, put where its spec names them."""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix="reef-ray-train-") as tmp:
        work = Path(tmp)
        update: dict[str, Any] = {"output_dir": work / "adapter"}
        full = method == "sft" and SFTSpec.model_validate_json(spec_json).mode == "full"
        if base_files is not None:
            key, folder = ("model", "base-checkpoint") if full else ("base_adapter", "base-adapter")
            write_tree(base_files, work / folder)
            update[key] = str(work / folder) if full else work / folder
        result: TrainResult
        if method == "rl":
            from reef.learning.trainers.grpo import train_grpo

            rspec = RLSpec.model_validate_json(spec_json)
            if tasks_file is not None and rspec.environment is not None:
                (work / "tasks.jsonl").write_bytes(tasks_file)
                update["environment"] = {**rspec.environment, "tasks": str(work / "tasks.jsonl")}
            result = train_grpo(rspec.model_copy(update=update))
        elif method == "preference":
            from reef.learning.trainers.preference import train_preference

            pspec = PreferenceSpec.model_validate_json(spec_json).model_copy(update=update)
            result = train_preference(pspec)
        else:
            from reef.learning.trainers.lora_sft import train_lora_sft

            sspec = SFTSpec.model_validate_json(spec_json).model_copy(update=update)
            result = train_lora_sft(sspec)
        return result.model_dump_json(), read_tree(result.adapter_dir)


def _tasks_file(spec: SFTSpec | PreferenceSpec | RLSpec) -> bytes | None:
    """The bytes of an RL run's tasks file (its environment's ``tasks:``), when any."""
    environment = spec.environment if isinstance(spec, RLSpec) else None
    tasks = None if environment is None else environment.get("tasks")
    return Path(tasks).read_bytes() if isinstance(tasks, str) else None


def _acquire(ray: Any, address: str | None, num_cpus: int) -> bool:
    """Make sure Ray is initialised; True when this run holds the local cluster."""
    global _users, _started
    with _lock:
        if _started:
            _users += 1
            return True
        if ray.is_initialized():
            return False
        if address is None:
            ray.init(
                address=None,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                num_cpus=num_cpus,
                log_to_driver=False,
            )
            _started, _users = True, 1
            return True
        ray.init(address=address, log_to_driver=False)
        return False


def _release(ray: Any) -> None:
    global _users, _started
    with _lock:
        _users -= 1
        if _users == 0 and _started:
            ray.shutdown()
            _started = False


def run_in_ray(  # noqa: C901
    spec: SFTSpec | PreferenceSpec | RLSpec,
    on_progress: ProgressCallback | None = None,
    *,
    address: str | None = None,
    timeout_seconds: float | None = None,
) -> TrainResult:
    """Run the spec's training function as a Ray task and return its result, with the
    adapter written to ``spec.output_dir``. ``address``: a Ray cluster (``ray://…`` or
    ``host:port``), or None for a local loopback cluster. Raises
    ``MissingExtraError`` without Ray (the ``ray`` extra), ``TrainingFailedError`` when
    Ray cannot start, the task fails or its worker dies, or it outlives
    ``timeout_seconds`` (it is cancelled)."""
    with optional_dependency("ray", "trainer: ray"):
        import ray
    method = "rl" if isinstance(spec, RLSpec) else "sft"
    method = "preference" if isinstance(spec, PreferenceSpec) else method
    cpus = spec.threads or 1
    gpus = 1 if spec.device == "cuda" else 0
    base = None if spec.base_adapter is None else read_tree(spec.base_adapter)
    if isinstance(spec, SFTSpec) and spec.mode == "full" and Path(spec.model).is_dir():
        base = read_tree(Path(spec.model))  # the checkpoint it continues from
    try:
        holds = _acquire(ray, address, cpus)
    except Exception as exc:  # Ray raises plain ConnectionError/RuntimeError here
        raise TrainingFailedError(f"ray could not start or connect: {exc}") from exc
    ref = None
    try:
        task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(train_task)
        ref = task.remote(spec.model_dump_json(), method, base, _tasks_file(spec))
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while not ray.wait([ref], timeout=POLL_SECONDS)[0]:
            if deadline is not None and time.monotonic() > deadline:
                raise TrainingFailedError(
                    f"ray training task timed out after {timeout_seconds} s", None
                )
        try:
            result_json, files = ray.get(ref)
        except ray.exceptions.RayError as exc:
            raise TrainingFailedError(f"ray training task failed: {exc}", None, str(exc)) from exc
    except BaseException:
        if ref is not None and not ray.wait([ref], timeout=0)[0]:
            ray.cancel(ref, force=True)  # interrupted or timed out: the task must not outlive us
        if holds:
            _release(ray)
        raise
    if holds:
        _release(ray)
    output = Path(spec.output_dir)
    write_tree(files, output)
    result = TrainResult.model_validate_json(result_json).model_copy(update={"adapter_dir": output})
    if on_progress is not None:
        curve = [float(x) for x in result.metrics.get("loss_curve", [])]
        for step, loss in enumerate(curve, start=1):
            on_progress(step, len(curve), loss)
    return result
