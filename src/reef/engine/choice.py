"""``--backend auto``: the fastest backend (and precision) whose greedy answers agree with
the eager engine's on this CPU, calibrated once and cached.

- **Candidates.** The eager engine is always one, at the dtype asked for, and is the
  reference: its float32 answers are PEFT's (``tests/engine/test_adapters.py``). The
  OpenVINO backend is one only where its extra imports and a converter is found
  (:func:`openvino_unavailable`): at the dtype asked for, or at float32, float16 and int8
  when the dtype is ``auto``. Without the extra, ``auto`` is ``eager`` at the cost of one
  failed import.
- **The check** (:func:`calibrate`). Every candidate answers :data:`PROBE_PROMPTS` chat
  prompts greedily (:data:`PROBE_TOKENS` tokens) on the base model and under a seeded
  rank-8 LoRA on every projection (:func:`probe_adapter`), and decodes
  :data:`SPEED_PROMPTS` of them one at a time (ms/token, prefill included). A candidate
  whose answers agree with the reference's on fewer than 95% of them is refused with its
  figure (``reef.engine.openvino.check_agreement``); the fastest of the others is chosen.
- **The cache** (:func:`choose`): ``<home>/engine/backend-choice.json`` holds the choice,
  the figures and the key they were measured under (:func:`choice_key`: the CPU's model
  and flags, the model source's digest, the dtype and threads asked for, the versions of
  torch, transformers, peft, openvino and openvino-genai, and :data:`PROBE_VERSION`); a
  different key calibrates again. The choice is logged in one line with its figures.

The check loads and probes every candidate: minutes, not seconds (443 s for five engines
on a loaded 2-core machine, docs/engine.md), so ``eager`` stays the default of
``reef engine serve``; ``reef quickstart`` asks for ``auto``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.engine.process import EngineOptions, cpu_flags

if TYPE_CHECKING:
    from reef.engine.runtime import Engine

logger = logging.getLogger("reef.engine")

PROBE_VERSION = 1
"""Bumped when the probe changes: a cached choice made by another probe is measured again."""
PROBE_PROMPTS = 20
PROBE_TOKENS = 16
SPEED_PROMPTS = 4
SPEED_TOKENS = 32
CHOICE_FILE = Path("engine") / "backend-choice.json"
OPENVINO_PRECISIONS = ("float32", "float16", "int8")
"""What ``auto`` tries OpenVINO at when the dtype is ``auto`` (int4 is not offered)."""
VERSIONED = ("torch", "transformers", "peft", "openvino", "openvino-genai")

TOPICS = (
    "the capital of France",
    "how to boil an egg",
    "three colours of the rainbow",
    "a tip for sleeping better",
    "what twelve times twelve is",
    "the largest planet",
    "how rain forms",
    "why the sky is blue",
    "a good name for a cat",
    "how to say good morning in Spanish",
)
VERBS = ("Tell me about", "Explain", "Write one sentence about", "Describe")


def probe_chats(count: int) -> list[list[dict[str, str]]]:
    """``count`` distinct single-turn chats (topics x verbs): the probe set, and the
    prompts of ``bench/engine_backends.py``'s agreement."""
    out = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        verb = VERBS[(i // len(TOPICS)) % len(VERBS)]
        out.append([{"role": "user", "content": f"{verb} {topic}."}])
    return out


@dataclass(frozen=True)
class Candidate:
    """A backend at a precision, and how to open an engine on it (started by the probe;
    None: the reference engine is this candidate, probed once)."""

    backend: str
    dtype: str
    open: Callable[[], Engine] | None

    @property
    def label(self) -> str:
        return f"{self.backend} {self.dtype}"


@dataclass(frozen=True)
class Probe:
    """One engine's greedy answers (base model, then under the adapter) and its speed."""

    base: list[list[int]]
    adapted: list[list[int]]
    ms_per_token: float


def openvino_unavailable() -> str | None:
    """None when the OpenVINO backend can serve here (its extra imports and a converter
    is found), else why not."""
    from reef.engine import openvino

    missing = openvino.available()
    if missing is not None:
        return missing
    if shutil.which(openvino.converter()) is None:
        return f"no converter {openvino.converter()!r} (set {openvino.CONVERTER_ENV})"
    return None


def probe_adapter(engine: Engine, directory: Path, seed: int = 1, std: float = 0.02) -> Path:
    """A rank-8 PEFT LoRA (alpha 16) on every projection of ``engine``'s model with seeded
    random weights (``lora_A`` uniform as PEFT draws it, ``lora_B`` normal with std
    ``std``: enough to change most answers of SmolLM2-135M), written to ``directory``.
    Built on an uninitialised copy of the model's shape, so the engine's own model (or
    its absence: OpenVINO's is weightless) is untouched."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reef.engine.openvino import PROJECTIONS

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(engine.loaded.model.config)  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(
            model, LoraConfig(r=8, lora_alpha=16, target_modules=list(PROJECTIONS))
        )
    peft_model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_A" in name:
                bound = 1 / parameter.shape[1] ** 0.5
                parameter.uniform_(-bound, bound, generator=generator)
            elif "lora_B" in name:
                parameter.normal_(std=std, generator=generator)
    peft_model.save_pretrained(str(directory))
    return directory


async def _answer(engine: Engine, ids: list[int], tokens: int, model: str) -> list[int]:
    from reef.engine.sequences import SamplingParams

    lease = engine.lease(model)
    stream = engine.generate(ids, SamplingParams(max_tokens=tokens, temperature=0.0), 1, lease)
    out: list[int] = []
    async for delta in stream:
        out.extend(delta.token_ids)
    return out


async def probe(engine: Engine, adapter: Path, prompts: int = PROBE_PROMPTS) -> Probe:
    """``engine``'s greedy answers to the probe set, all at once (the engine batches
    them), on the base model and under ``adapter``, then its ms/token decoding
    :data:`SPEED_PROMPTS` of them one at a time (after a warm-up request)."""
    chats = [engine.encode_chat(chat, None) for chat in probe_chats(prompts)]
    base_name = engine.name
    base = await asyncio.gather(*(_answer(engine, c, PROBE_TOKENS, base_name) for c in chats))
    await engine.load_adapter("reef-probe", adapter, None, replace=True)
    adapted = await asyncio.gather(*(_answer(engine, c, PROBE_TOKENS, "reef-probe") for c in chats))
    await _answer(engine, chats[0], 1, base_name)
    started, tokens = time.perf_counter(), 0
    for chat in chats[:SPEED_PROMPTS]:
        tokens += len(await _answer(engine, chat, SPEED_TOKENS, base_name))
    seconds = time.perf_counter() - started
    return Probe(list(base), list(adapted), seconds * 1000 / max(tokens, 1))


def _probe_started(engine: Engine, adapter: Path) -> Probe:
    engine.start()
    try:
        return asyncio.run(probe(engine, adapter))
    finally:
        engine.stop()


def calibrate(
    reference: Callable[[], Engine], candidates: list[Candidate], adapter: Path | None = None
) -> dict[str, Any]:
    """Probe the ``reference`` engine and every candidate; return the choice record:
    ``{"backend", "dtype", "figures": [{"backend", "dtype", "agreement", "ms_per_token",
    "refused"}], "seconds"}``. A candidate that disagrees (under 95%) or fails to open is
    refused with its figure or its error; the fastest of the others is chosen (the first
    candidate, when all are refused). ``adapter``: the probe's LoRA (default: one
    :func:`probe_adapter` writes for the reference's model)."""
    from reef.core.errors import ReefError
    from reef.engine.openvino import BackendDisagreesError, agreement, check_agreement

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="reef-probe-"))
    try:
        engine = reference()
        if adapter is None:
            adapter = probe_adapter(engine, work / "lora")
        expected = _probe_started(engine, adapter)
        del engine
        answers = expected.base + expected.adapted
        figures: list[dict[str, Any]] = []
        for candidate in candidates:
            figure: dict[str, Any] = {"backend": candidate.backend, "dtype": candidate.dtype}
            figures.append(figure)
            try:
                got = (
                    expected
                    if candidate.open is None
                    else _probe_started(candidate.open(), adapter)
                )
            except (ReefError, OSError, RuntimeError) as exc:  # e.g. a conversion failed
                figure["refused"] = f"cannot serve: {exc}"
                continue
            figure["agreement"] = agreement(got.base + got.adapted, answers)
            figure["ms_per_token"] = round(got.ms_per_token, 2)
            try:
                check_agreement(got.base + got.adapted, answers, candidate.label)
            except BackendDisagreesError as exc:
                figure["refused"] = str(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    served = [f for f in figures if "refused" not in f]
    best = min(served, key=lambda f: f["ms_per_token"]) if served else figures[0]
    return {
        "backend": best["backend"],
        "dtype": best["dtype"],
        "figures": figures,
        "seconds": round(time.perf_counter() - started, 1),
    }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and a digest of its flags (the model name alone is generic on
    some virtual machines)."""
    name = "unknown"
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[-1].strip()
                break
    flags = hashlib.sha256(" ".join(sorted(cpu_flags(cpuinfo))).encode()).hexdigest()[:12]
    return f"{name} (flags {flags})"


def versions() -> dict[str, str]:
    """The installed versions of what the answers depend on (absent: ``-``)."""
    out = {}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "-"
    return out


def choice_key(source_digest: str, options: EngineOptions) -> dict[str, Any]:
    """What a choice was measured under; another key calibrates again."""
    return {
        "probe": PROBE_VERSION,
        "cpu": cpu_model(),
        "source": source_digest,
        "dtype": options.dtype,
        "threads": options.threads,
        "versions": versions(),
    }


def choose(
    path: Path, key: dict[str, Any], measure: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], bool]:
    """The choice cached at ``path`` when it was made under ``key``, else ``measure()``'s,
    written there (atomically) with ``key``. Returns (the record, whether it was cached)."""
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(cached, dict) and cached.get("key") == key:
            return cached, True
    record = {**measure(), "key": key}
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(scratch, path)
    return record, False


def describe(record: dict[str, Any]) -> str:
    """The choice and its figures in one line."""
    parts = []
    for figure in record["figures"]:
        label = f"{figure['backend']} {figure['dtype']}"
        if "agreement" in figure:
            label += f" {figure['agreement']:.0%} agree, {figure['ms_per_token']:.1f} ms/token"
        if "refused" in figure:
            label += f" (refused: {figure['refused']})"
        parts.append(label)
    return f"{record['backend']} {record['dtype']} [{'; '.join(parts)}]"


def resolve_backend(
    model: str,
    home: Path,
    options: EngineOptions,
    candidates: Callable[[], list[Candidate]],
) -> EngineOptions:
    """``options`` with ``backend="auto"`` decided for this CPU (module docstring); other
    backends unchanged. ``candidates``: the eager engine at ``options.dtype``, then
    OpenVINO at each precision ``auto`` tries (``reef.engine.server.backend_candidates``),
    asked only where OpenVINO can serve. The choice is logged in one line."""
    if options.backend != "auto":
        return options
    eager = replace(options, backend="eager")
    missing = openvino_unavailable()
    if missing is not None:
        logger.info("engine backend auto: eager (openvino is not a candidate: %s)", missing)
        return eager
    from reef.engine.models import DEFAULT_MODEL, load_model, smollm2_cache
    from reef.engine.openvino import source_digest
    from reef.engine.runtime import Engine

    source = smollm2_cache(home) if model == DEFAULT_MODEL else Path(model)
    if not (source / "config.json").is_file():
        logger.info("engine backend auto: eager (openvino serves no %r)", model)
        return eager
    key = choice_key(source_digest(source), options)

    def measure() -> dict[str, Any]:
        logger.info("engine backend auto: calibrating (once for this CPU, model and versions)")
        return calibrate(
            lambda: Engine(load_model(model, home), max_batch=options.max_batch,
                           threads=options.threads),
            candidates(),
        )  # fmt: skip

    path = home / CHOICE_FILE
    record, cached = choose(path, key, measure)
    how = f"cached in {path}" if cached else f"calibrated in {record['seconds']} s, {path}"
    logger.info("engine backend auto: %s (%s)", describe(record), how)
    return replace(options, backend=record["backend"], dtype=record["dtype"])
