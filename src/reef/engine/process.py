"""Running the engine as a child process: its command line, its READY line, and its
death with the parent. Torch-free, so a parent (``reef serve``) can use it cheaply.

The child prints exactly one line starting with :data:`READY_PREFIX` to stdout once it
listens, followed by a JSON object ``{"host", "port", "model", "base_url"}``; log
lines go to stderr. :func:`parse_ready_line` reads it back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

READY_PREFIX = "REEF_ENGINE_READY "

EngineDtype = Literal["float32", "float16", "bfloat16", "int8", "auto"]
"""The weights' precision: ``float32``, ``float16`` (the projections' weights in float16
for fbgemm's GEMM, activations and sums in float32: x86 CPUs), ``bfloat16``, ``int8``
(weight-only: the decoder layers' weights in int8, the rest and the activations in
bfloat16; ``reef.engine.precision``), or ``auto`` (bfloat16 where the CPU computes it natively,
AVX-512 BF16 or AMX, else float16 where fbgemm runs, else float32; see docs/engine.md)."""
ENGINE_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "int8", "auto")
EngineBackend = Literal["eager", "openvino", "auto"]
"""What runs the model: ``eager`` (PyTorch, the default), ``openvino`` (OpenVINO GenAI,
the ``openvino`` extra; ``reef.engine.openvino``) or ``auto`` (the fastest of them whose
greedy answers agree with the eager engine's on this CPU, calibrated once:
``reef.engine.choice``)."""
ENGINE_BACKENDS: tuple[str, ...] = ("eager", "openvino", "auto")


@dataclass(frozen=True)
class EngineOptions:
    """How an engine serves: ``max_batch`` sequences decoded together, torch
    ``threads`` (None: all cores but one), the weights' ``dtype`` and the MiB of prompt
    prefixes' keys and values kept for reuse (``reef.engine.prefixes``; 0: none)."""

    max_batch: int = 16
    threads: int | None = None
    dtype: EngineDtype = "float32"
    prefix_cache_mb: int = 256
    backend: EngineBackend = "eager"

    def argv(self) -> list[str]:
        """These options as ``python -m reef.engine serve`` flags."""
        extra = ["--threads", str(self.threads)] if self.threads else []
        if self.backend != "eager":
            extra += ["--backend", self.backend]
        return [
            "--max-batch",
            str(self.max_batch),
            "--dtype",
            self.dtype,
            "--prefix-cache-mb",
            str(self.prefix_cache_mb),
            *extra,
        ]


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (``avx512_bf16``, ``amx_bf16``, ...); empty where
    ``cpuinfo`` cannot be read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[-1].split())
    return frozenset()


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU computes bfloat16 natively (the ``avx512_bf16`` or ``amx_bf16``
    flag); False where the flags cannot be read."""
    return bool(cpu_flags(cpuinfo) & {"avx512_bf16", "amx_bf16"})


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU has AMX tiles for bfloat16 matrix products (``amx_bf16``)."""
    return "amx_bf16" in cpu_flags(cpuinfo)


def resolve_dtype(
    dtype: EngineDtype, cuda: bool = False, fp16: bool = False
) -> Literal["float32", "float16", "bfloat16", "int8"]:
    """``dtype`` with ``auto`` decided for this machine: bfloat16 where a GPU serves
    (``cuda``); on a CPU, float16 where fbgemm's float16 product runs (``fp16``:
    ``reef.engine.precision.can_fp16``), else bfloat16 where the CPU computes it
    natively, else float32.

    float16 comes before bfloat16 on a CPU because it was both faster and closer to
    float32 on every CPU measured (docs/benchmarks.md, ``bench/engine_dtypes.py``,
    SmolLM2-135M, one thread): on an AMD EPYC with AVX-512 BF16 it decoded 48.8 tokens/s
    alone and 157 at 8 rows against bfloat16's 28.6 and 151 (fbgemm's float16 product
    reads the weights at ~24 GB/s, oneDNN's bfloat16 one at ~12), and on AVX2-only CPUs
    bfloat16 has no fast kernel at all. Its weights keep 3 more mantissa bits than
    bfloat16's. (Not yet measured against bfloat16 on a CPU with AMX.)"""
    if dtype != "auto":
        return dtype
    if cuda:
        return "bfloat16"
    if fp16:
        return "float16"
    return "bfloat16" if cpu_has_bf16() else "float32"


_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ReadyInfo:
    """Where a started engine listens."""

    host: str
    port: int
    model: str

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://host:port/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


def ready_line(info: ReadyInfo) -> str:
    """The line a child prints once it listens (no trailing newline)."""
    payload = {"host": info.host, "port": info.port, "model": info.model}
    return READY_PREFIX + json.dumps({**payload, "base_url": info.base_url})


def parse_ready_line(line: str) -> ReadyInfo | None:
    """The :class:`ReadyInfo` of a READY line, or None for any other line."""
    if not line.startswith(READY_PREFIX):
        return None
    payload = json.loads(line[len(READY_PREFIX) :])
    return ReadyInfo(str(payload["host"]), int(payload["port"]), str(payload["model"]))


def engine_command(
    model: str,
    home: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    options: EngineOptions | None = None,
) -> list[str]:
    """argv that starts the engine as a child of this Python: ``python -m reef.engine
    serve …`` with ``--parent-pid`` set to this process, so the child dies with it.
    Port 0 lets the OS pick a free port."""
    return [
        sys.executable,
        "-m",
        "reef.engine",
        "serve",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--home",
        str(home),
        *(options or EngineOptions()).argv(),
        "--parent-pid",
        str(os.getpid()),
    ]


def exit_with_parent(parent_pid: int | None = None) -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies (Linux only;
    elsewhere a no-op). Exits at once if the parent is already gone: when the parent
    is not ``parent_pid`` (given) or changed while the request was being made.

    Linux ties the signal to the parent *thread* that forked us: parents should start
    the engine from a thread that lives as long as they do (the main thread).
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return
    if os.getppid() != parent or (parent_pid is not None and parent != parent_pid):
        os._exit(0)  # the parent died before the prctl took effect
