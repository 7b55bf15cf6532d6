"""The GPU check: one offline command on a CUDA machine (at most 10 minutes on one GPU)
that measures what Reef does on a GPU, and says plainly what it could not measure.

    python bench/gpu_check.py --out bench/results/gpu-check.json --markdown gpu-check.md
    python bench/gpu_check.py --cpu-smoke --out /tmp/gpu-check.json   # any machine, < 5 min

What it runs, each through Reef's own code:

- ``sft`` training, LoRA and ``full``, with the trainer the learners use (``SFTSpec``
  run by ``run_in_child``: the training child process) on CUDA with the trainer's
  defaults there (bf16 autocast; gradient checkpointing for ``full``): tokens/s, the
  child's peak GPU memory (``peak_memory_bytes``) and its peak host memory
  (``peak_rss_bytes``, what a CPU run is measured by). Models: random-initialised Llama
  configurations of about 0.5B and 1.5B parameters built here with a fixed seed (the
  engine's byte-level tokenizer, the vocabulary set to 49152 as SmolLM2's so the output
  head costs what it would), and SmolLM2-135M when its packaged GGUF is installed.
- The same trainer on the CPU, on the 0.5B model for a few steps (the CPU's default
  precision, float32), for the GPU/CPU ratio of tokens/s, and its peak host memory.
- vLLM through the gateway and multi-LoRA throughput (``bench/gpu_serving.py``): vLLM
  serves the 0.5B model, ``reef serve`` runs in front of it, and 20 adapter publishes
  happen while clients load the gateway, each adapter fingerprinted and verified by the
  gateway before its flip (publish to the first verified response from the new
  release, p50/p99; failed requests, which must be 0); then one adapter's directory
  holding another's weights, which staging on vLLM must refuse with the diff while
  the adapter before serves on; then completion tokens/s at 1, 4
  and 16 adapters against the base (the vendor anchor is 98/94/88%); then an in-place
  checkpoint reload through the gateway (``checkpoint_loading: vllm``) and back.
- The Ray trainer (``run_in_ray``) on the 0.5B model's LoRA run, when ray is installed.
- The fingerprint check on a deliberately wrong adapter (``fingerprint_check``): one
  adapter's weights offered under another's name, compared with its fingerprint.
- Everything it cannot run is reported ``skipped`` with the reason: the embedded engine
  on CUDA (it serves on the CPU only), vLLM and multi-LoRA on a GPU machine without
  vllm, the Ray trainer without ray. No figure
  is made up.

tokens/s is the trainer's own figure (non-padding tokens through forward, backward and
the optimizer step, over the training loop's wall time, first step included); "steady"
leaves the first step out (from the child's per-step progress lines), which on a GPU
holds the kernels' first-use cost.

``--cpu-smoke`` runs the same code paths on a tiny model on the CPU (no CUDA; the
accelerator's runs in bf16 with gradient checkpointing, as the trainer picks on CUDA;
the serving runs against the loopback vLLM-protocol fake with 4 publishes), so that a
test can run the whole script (tests/learning/test_gpu_check_bench.py). It writes one
JSON (``--out``) after every run, so a run cut short still leaves its figures, and
prints the Markdown table (also to ``--markdown``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_serving  # bench/gpu_serving.py: publishes under load, multi-LoRA throughput
from contenders import ChildProcesses

from reef.engine.errors import ModelSourceError
from reef.engine.models import DEFAULT_MODEL, smollm2_gguf
from reef.learning.trainers import (
    Budget,
    SFTExample,
    SFTSpec,
    TrainingFailedError,
    run_in_child,
)
from reef.learning.trainers.ray_runner import run_in_ray

VOCAB_SIZE = 49152  # SmolLM2's vocabulary
SEED = 20261204
COLORS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]
ANIMALS = ["cat", "dog", "owl", "fox", "whale", "horse", "tiger", "crab"]
PLACES = ["river", "forest", "harbour", "hills", "desert", "village", "meadow", "cliffs"]

ENGINE_REASON = (
    "the embedded engine serves on the CPU only: reef.engine.models.load_model loads to "
    "the CPU and nothing in reef.engine moves the model or its batch tensors to a CUDA "
    "device (on a GPU machine resolve_dtype picks bfloat16, and decoding still runs on "
    "the CPU); decode tokens/s at 1 and 8 rows and the in-place checkpoint reload on "
    "CUDA wait for a CUDA path in the engine"
)
FINGERPRINT_CHECK = "fingerprint check catching a wrong adapter"
MAX_PROBE_TOKENS = 16


@dataclass(frozen=True)
class ModelShape:
    """A random-initialised Llama configuration to build."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


FULL_SHAPES = {
    "0.5b": ModelShape("llama-0.5b-random", 1024, 28, 16, 4, 4096),
    "1.5b": ModelShape("llama-1.5b-random", 1536, 30, 12, 2, 8960),
}
# One tiny model: its runs take the same code paths as both full-size ones.
SMOKE_SHAPES = {"0.5b": ModelShape("llama-smoke-random", 64, 2, 4, 2, 128)}


@dataclass(frozen=True)
class Plan:
    """The sizes of one check: GPU steps, CPU steps, batch and sequence length."""

    shapes: dict[str, ModelShape]
    gpu_steps: dict[str, int]
    cpu_steps: dict[str, int]
    batch: int
    max_seq_len: int
    examples: int
    answer_bytes: int
    max_seconds: float | None  # the trainer's own cap per run (Budget.max_seconds)


FULL_PLAN = Plan(
    FULL_SHAPES, {"lora": 40, "full": 20}, {"lora": 3, "full": 3}, 8, 512, 64, 440, 60.0
)
SMOKE_PLAN = Plan(SMOKE_SHAPES, {"lora": 3, "full": 3}, {"lora": 3, "full": 3}, 2, 64, 8, 40, None)


@dataclass
class TrainRun:
    """One training run's figures (or why it did not run)."""

    model: str
    mode: str
    device: str
    steps: int
    role: str
    runner: str = "child"
    status: str = "ok"
    reason: str = ""
    tokens: int = 0
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    steady_tokens_per_second: float | None = None
    peak_memory_bytes: int | None = None
    peak_rss_bytes: int | None = None  # the training process's host memory
    bf16: bool | None = None
    load_seconds: float = 0.0
    wall_seconds: float = 0.0
    final_loss: float | None = None
    parameters: int | None = None
    stop_reason: str | None = None  # the trainer's: steps, or max_seconds (capped)


@dataclass
class Report:
    """Everything the check writes to its JSON."""

    command: str
    mode: str
    date: str
    machine: dict[str, Any]
    settings: dict[str, Any]
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    training: list[TrainRun] = field(default_factory=list)
    ratios: list[dict[str, Any]] = field(default_factory=list)
    serving: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """GPU, CUDA, torch and CPU of this machine."""
    import torch

    info: dict[str, Any] = {
        "gpu": None,
        "gpu_memory_bytes": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "peft": version("peft"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return info


def dataset(count: int, answer_bytes: int) -> list[SFTExample]:
    """Fixed, seeded chat examples whose answers run to about ``answer_bytes`` bytes
    (the byte-level tokenizer makes that about as many tokens)."""
    rng = random.Random(SEED)
    examples = []
    for index in range(count):
        color, animal = rng.choice(COLORS), rng.choice(ANIMALS)
        sentences = []
        while sum(len(s) + 1 for s in sentences) < answer_bytes:
            sentences.append(
                f"The {color} {animal} spends the {rng.choice(['morning', 'evening'])} "
                f"near the {rng.choice(PLACES)}, {rng.choice(['resting', 'exploring'])}."
            )
        question = f"Describe a {color} {animal} in detail. (item {index})"
        examples.append(
            SFTExample(messages=[{"role": "user", "content": question}], target=" ".join(sentences))
        )
    return examples


def build_model(shape: ModelShape, directory: Path, cuda: bool) -> dict[str, Any]:
    """Build ``shape`` with random weights (fixed seed; on the GPU when ``cuda``, which is
    faster), save it in bfloat16 with the engine's byte-level tokenizer; return its
    parameter count and build time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from reef.engine.tiny import build_tiny_tokenizer

    started = time.monotonic()
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    with torch.device("cuda" if cuda else "cpu"):
        model = LlamaForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16)  # type: ignore[call-arg]
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    del model
    if cuda:
        torch.cuda.empty_cache()
    return {
        "parameters": parameters,
        "build_seconds": round(time.monotonic() - started, 2),
        "config": {
            "architecture": "llama",
            "hidden_size": shape.hidden,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "intermediate_size": shape.intermediate,
            "vocab_size": VOCAB_SIZE,
            "tie_word_embeddings": True,
        },
    }


@dataclass(frozen=True)
class Job:
    """One training run to do."""

    model: str  # a name in the report
    source: str  # what SFTSpec.model gets
    mode: str
    device: str  # cuda, or cpu (in a smoke run, the accelerator's runs too)
    steps: int
    role: str  # "accelerator", "cpu" (the reference for the ratio), or "ray"
    runner: str = "child"  # run_in_child, or "ray": run_in_ray (the Ray trainer)


class Checker:
    """Runs the jobs within the time budget and fills the report."""

    def __init__(self, args: argparse.Namespace, plan: Plan, report: Report, scratch: Path):
        self.args = args
        self.plan = plan
        self.report = report
        self.scratch = scratch
        self.started = time.monotonic()
        self.examples = dataset(plan.examples, plan.answer_bytes)

    def remaining(self) -> float:
        return float(self.args.budget_seconds) - (time.monotonic() - self.started)

    def train(self, job: Job) -> TrainRun:
        """Run ``job`` through the training child; a failure is recorded, not raised."""
        run = TrainRun(job.model, job.mode, job.device, job.steps, job.role, job.runner)
        left = self.remaining()
        if left < self.args.min_run_seconds:
            run.status, run.reason = "skipped", f"time budget: {left:.0f} s left"
            return self.record(run)
        tag = f"{job.model}-{job.mode}-{job.device}-{job.runner}"
        output = self.scratch / f"out-{tag}"
        rehearsal = job.role in ("accelerator", "ray") and job.device == "cpu"
        spec = SFTSpec(
            model=job.source,
            home=self.scratch / "home",
            examples=self.examples,
            output_dir=output,
            mode="full" if job.mode == "full" else "lora",
            budget=Budget(
                steps=job.steps,
                schedule="constant",
                warmup_fraction=0.0,
                max_seconds=self.plan.max_seconds,
            ),
            batch_size=self.plan.batch,
            max_seq_len=self.plan.max_seq_len,
            device="cuda" if job.device == "cuda" else "cpu",
            # a smoke run's accelerator runs take what auto picks on CUDA
            bf16=True if rehearsal else "auto",
            gradient_checkpointing=True if rehearsal else "auto",
        )
        stamps: list[float] = []
        started = time.monotonic()
        try:
            if job.runner == "ray":
                # Ray hands every step's loss over at the end: no steady rate
                result = run_in_ray(spec, timeout_seconds=left)
            else:
                result = run_in_child(
                    spec,
                    lambda step, steps, loss: stamps.append(time.monotonic()),
                    work_dir=self.scratch / f"work-{tag}",
                    timeout_seconds=left,
                )
        except TrainingFailedError as exc:
            run.status, run.reason = "failed", f"{exc}\n{exc.log_tail[-2000:]}"
            return self.record(run)
        finally:
            shutil.rmtree(output, ignore_errors=True)
        fill(run, result.metrics, stamps)
        run.wall_seconds = round(time.monotonic() - started, 2)
        return self.record(run)

    def record(self, run: TrainRun) -> TrainRun:
        self.report.training.append(run)
        self.report.write(self.args.out)
        figure = f"{run.tokens_per_second:.0f} tokens/s" if run.status == "ok" else run.status
        print(f"{run.model} {run.mode} on {run.device} ({run.runner}): {figure}", flush=True)
        if run.status != "ok":
            print(run.reason, flush=True)
        return run

    def serve(self, result: dict[str, Any]) -> None:
        """Record one serving run's result."""
        self.report.serving.append(result)
        self.report.write(self.args.out)
        print(f"{result['check']} on {result['upstream']}: {result['status']}", flush=True)

    def skip(self, check: str, reason: str) -> None:
        self.report.skipped.append({"check": check, "reason": reason})
        self.report.write(self.args.out)
        print(f"skipped {check}: {reason}", flush=True)


def fill(run: TrainRun, metrics: dict[str, Any], stamps: list[float]) -> None:
    """Copy the trainer's metrics into ``run``; the steady rate from the step stamps."""
    run.tokens = int(metrics["tokens"])
    run.seconds = float(metrics["seconds"])
    run.tokens_per_second = float(metrics["tokens_per_second"])
    run.peak_memory_bytes = metrics.get("peak_memory_bytes")
    run.peak_rss_bytes = metrics.get("peak_rss_bytes")
    run.bf16 = bool(metrics.get("bf16"))
    run.load_seconds = float(metrics["load_seconds"])
    run.final_loss = float(metrics["loss_curve"][-1])
    run.parameters = metrics.get("parameters")
    run.stop_reason = metrics.get("stop_reason")
    steps = run.steps = int(metrics["steps"])  # fewer than planned when capped
    if steps >= 3 and len(stamps) == steps and stamps[-1] > stamps[0]:
        # steps 2..n: the mean tokens per step over the time after the first step ended
        run.steady_tokens_per_second = round(
            run.tokens * (steps - 1) / steps / (stamps[-1] - stamps[0]), 2
        )


def prepare_models(checker: Checker, cuda: bool) -> dict[str, str]:
    """Build the random models; return report name -> model directory."""
    sources = {}
    for shape in checker.plan.shapes.values():
        directory = checker.scratch / "models" / shape.name
        checker.report.models[shape.name] = build_model(shape, directory, cuda)
        sources[shape.name] = str(directory)
        built = checker.report.models[shape.name]
        print(f"built {shape.name}: {built['parameters']:,} parameters", flush=True)
    return sources


def smollm2_source(checker: Checker) -> str | None:
    """``smollm2-135m`` when its GGUF is installed and this is not a smoke run; else
    None, with the reason recorded."""
    try:
        gguf = smollm2_gguf()
    except ModelSourceError as exc:
        checker.skip(f"sft on {DEFAULT_MODEL}", f"its packaged GGUF is not installed: {exc}")
        return None
    if checker.args.cpu_smoke:
        checker.skip(
            f"sft on {DEFAULT_MODEL}",
            f"--cpu-smoke trains tiny models only (the GGUF is installed: {gguf.name})",
        )
        return None
    return DEFAULT_MODEL


def training_jobs(plan: Plan, sources: dict[str, str], accelerator: str) -> list[Job]:
    """The accelerator's runs on every model, then the CPU's on the smallest."""
    jobs = [
        Job(name, source, mode, accelerator, plan.gpu_steps[mode], "accelerator")
        for name, source in sources.items()
        for mode in ("lora", "full")
        if not (source == DEFAULT_MODEL and mode == "full")
    ]
    smallest = plan.shapes["0.5b"].name
    jobs += [
        Job(smallest, sources[smallest], mode, "cpu", plan.cpu_steps[mode], "cpu")
        for mode in ("lora", "full")
    ]
    return jobs


def ratios(runs: list[TrainRun]) -> list[dict[str, Any]]:
    """accelerator / CPU tokens/s for each model and mode measured on both."""
    out = []
    cpu = {(r.model, r.mode): r for r in runs if r.role == "cpu" and r.status == "ok"}
    for run in runs:
        other = cpu.get((run.model, run.mode))
        if run.role != "accelerator" or run.status != "ok" or other is None:
            continue
        steady = None
        if run.steady_tokens_per_second and other.steady_tokens_per_second:
            steady = round(run.steady_tokens_per_second / other.steady_tokens_per_second, 1)
        out.append(
            {
                "model": run.model,
                "mode": run.mode,
                "ratio": round(run.tokens_per_second / other.tokens_per_second, 1),
                "steady_ratio": steady,
            }
        )
    return out


PUBLISH_CHECK = "vLLM through the gateway: adapter publishes under load"
SWAPPED_CHECK = "a wrong adapter refused by staging through the gateway"
THROUGHPUT_CHECK = "multi-LoRA throughput at 1/4/16 adapters against the base"
INPLACE_CHECK = "in-place checkpoint reload"
RAY_CHECK = "Ray trainer on the GPU"


def serving_checks(
    checker: Checker, sources: dict[str, str], cuda: bool, wrong: list[Path]
) -> None:
    """Adapter publishes under load through the gateway (each verified before its flip;
    then ``wrong[1]`` and ``wrong[0]``'s directory holding ``wrong[1]``'s weights, which
    staging must refuse), then multi-LoRA throughput, then an in-place reload, against
    vLLM on the GPU (``bench/gpu_serving.py``); in a smoke run against the loopback
    vLLM-protocol fake, fewer publishes. Skipped, with the reason, without vllm on a GPU
    machine or when the time budget is spent."""
    checks = (PUBLISH_CHECK, SWAPPED_CHECK, THROUGHPUT_CHECK, INPLACE_CHECK)
    if cuda and importlib.util.find_spec("vllm") is None:
        reason = "vllm is not installed in this Python, so nothing can serve adapters on the GPU"
        for check in checks:
            checker.skip(check, reason)
        return
    left = checker.remaining()
    if left < checker.args.min_run_seconds:
        reason = f"time budget: {left:.0f} s left"
        for check in checks:
            checker.skip(check, reason)
        return
    plan = gpu_serving.SMOKE_SERVING if checker.args.cpu_smoke else gpu_serving.GPU_SERVING
    name = checker.plan.shapes["0.5b"].name
    model_dir = Path(sources[name])
    count = max(plan.publishes, *plan.adapter_counts)
    adapters = gpu_serving.make_adapters(model_dir, checker.scratch / "adapters", count)
    work = checker.scratch / "serving"
    work.mkdir(parents=True, exist_ok=True)
    children = ChildProcesses(work)
    try:
        kind = "vllm" if cuda else "fake"
        try:
            upstream = gpu_serving.start_upstream(children, kind, model_dir, name)
        except Exception as exc:  # a server that does not come up is a result
            reason = f"{kind} did not start: {exc}"
            for check in checks:
                checker.serve({"check": check, "upstream": kind, "status": "failed",
                               "reason": reason})  # fmt: skip
            return
        for check, run in (
            (PUBLISH_CHECK, lambda: gpu_serving.publish_under_load(
                upstream, adapters, plan, work / "publishes", (wrong[0], wrong[1]))),
            (THROUGHPUT_CHECK, lambda: gpu_serving.multi_lora_throughput(
                upstream, adapters, plan)),
            (INPLACE_CHECK, lambda: gpu_serving.inplace_reload(
                upstream, model_dir, work / "in-place")),
        ):  # fmt: skip
            try:
                result = run()
            except Exception as exc:  # recorded, and the next check still runs
                result = {"check": check, "upstream": kind, "status": "failed",
                          "reason": repr(exc)}  # fmt: skip
            result["check"] = check
            swapped = result.pop("swapped", None)
            checker.serve(result)
            if check == PUBLISH_CHECK:
                swapped = swapped or {"status": "failed", "reason": "the publishes did not end"}
                checker.serve({**swapped, "check": SWAPPED_CHECK, "upstream": kind})
    finally:
        children.stop_all()


def ray_check(checker: Checker, sources: dict[str, str], cuda: bool) -> None:
    """The Ray trainer (``run_in_ray``) on the 0.5B model, LoRA: on the GPU, or in a
    smoke run on the CPU; skipped without ray."""
    if importlib.util.find_spec("ray") is None:
        checker.skip(RAY_CHECK, "ray is not installed in this Python")
        return
    name = checker.plan.shapes["0.5b"].name
    steps = checker.plan.gpu_steps["lora"]
    device = "cuda" if cuda else "cpu"
    checker.train(Job(name, sources[name], "lora", device, steps, "ray", "ray"))


def fingerprint_check(checker: Checker, model_dir: Path, adapters: list[Path]) -> None:
    """The fingerprint check on a deliberately wrong adapter. ``adapters[0]`` is
    fingerprinted on the built-in probe prompts in the trainer's engine on this device
    (bf16 on CUDA); then its own weights and ``adapters[1]``'s (the wrong ones, offered
    under its name) are probed again and compared by the rule staging uses
    (``reef.releases.compare_fingerprint``): its own must match, the other's must not.
    A miss where no probe starts above a near tie (a random model's top two tokens
    closer than the tolerance) is ``inconclusive``: no weights could be told apart. On
    CUDA it runs again in float32 (tolerance 0.01), where a random model's margins are
    wide enough to decide."""
    if len(adapters) < 2:
        checker.skip(FINGERPRINT_CHECK, "fewer than two adapters were made")
        return
    import torch

    runs: list[tuple[str, bool | None]] = [(FINGERPRINT_CHECK, None)]
    if torch.cuda.is_available():
        runs.append((f"{FINGERPRINT_CHECK}, float32 on the GPU", False))
    for check, bf16 in runs:
        decisive = None
        try:
            caught, detail, decisive = _wrong_adapter_caught(
                model_dir, adapters[0], adapters[1], bf16
            )
        except Exception as exc:  # a check that breaks is a result too
            caught, detail = False, repr(exc)
        status = "ok" if caught else "failed"
        if not caught and decisive == 0 and detail.startswith("own weights: match"):
            status = "inconclusive"
            detail += "; no probe starts above a near tie at this tolerance"
        checker.serve(
            {
                "check": check,
                "upstream": "trainer",
                "status": status,
                "detail": detail,
                "decisive_probes": decisive,
            }
        )


def _wrong_adapter_caught(
    model_dir: Path, expected: Path, actual: Path, bf16: bool | None = None
) -> tuple[bool, str, int]:
    """Whether ``expected``'s fingerprint accepts its own weights and refuses
    ``actual``'s, what the comparison said of each, and how many probes start with a
    token whose margin is over the fingerprint's tolerance."""
    from reef.releases import (
        FINGERPRINT_TOLERANCE,
        ProbeAnswer,
        compare_fingerprint,
        probe_prompts,
    )

    fingerprint = _probe_weights(model_dir, expected, probe_prompts([]), MAX_PROBE_TOKENS, bf16)
    prompts = [probe.messages for probe in fingerprint.probes]
    verdicts = []
    for weights in (expected, actual):
        probed = _probe_weights(model_dir, weights, prompts, fingerprint.max_new_tokens, bf16)
        answers = [
            ProbeAnswer(
                tokens=list(p.tokens),
                text=p.text,
                logprobs=list(p.logprobs),
                finish_reason="stop" if p.ended else "length",
            )
            for p in probed.probes
        ]
        verdicts.append(compare_fingerprint(fingerprint, answers))
    own, wrong = verdicts
    detail = (
        f"own weights: {'match' if own is None else own.describe()}; "
        f"wrong weights: {'MATCHED (not caught)' if wrong is None else wrong.describe()}"
    )
    limit = FINGERPRINT_TOLERANCE[fingerprint.dtype]
    decisive = sum(1 for p in fingerprint.probes if p.margins and p.margins[0] > limit)
    return own is None and wrong is not None, detail, decisive


def _probe_weights(
    model_dir: Path, adapter: Path, prompts: list[Any], max_new_tokens: int, bf16: bool | None
) -> Any:
    """``adapter`` on ``model_dir``'s base, probed as the trainer fingerprints (same
    loader, device and precision rule; ``bf16`` False: float32 on any device)."""
    import torch
    from peft import PeftModel

    from reef.engine.models import load_model
    from reef.learning.trainers.fingerprint import TrainedModel, compute_fingerprint
    from reef.learning.trainers.precision import use_bf16

    loaded = load_model(str(model_dir), Path(".reef"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = PeftModel.from_pretrained(loaded.model, str(adapter)).to(device)
    autocast = use_bf16("auto", device) if bf16 is None else bf16
    trained = TrainedModel(model, loaded.tokenizer, loaded.eos_token_ids, device, autocast)
    return compute_fingerprint(trained, prompts, max_new_tokens)


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def count(parameters: int | None) -> str:
    if not parameters:
        return "-"
    return f"{parameters / 1e9:.2f}B" if parameters >= 1e8 else f"{parameters / 1e6:.1f}M"


def table_row(report: Report, run: TrainRun) -> str:
    """One training run as a row of the Markdown table."""
    params = run.parameters or report.models.get(run.model, {}).get("parameters")
    precision = "-" if run.bf16 is None else ("bf16" if run.bf16 else "float32")
    steady = run.steady_tokens_per_second
    status = run.status if run.status == "ok" else f"{run.status}: {run.reason.splitlines()[0]}"
    if run.stop_reason == "max_seconds":
        status += " (stopped by the time cap)"
    device = f"{run.device} (reference)" if run.role == "cpu" else run.device
    if run.runner == "ray":
        device += " (Ray trainer)"
    return (
        f"| `{run.model}` | {count(params)} | {run.mode} | {device} | {precision} | "
        f"{run.steps} | {run.tokens_per_second:,.0f} | "
        f"{'-' if steady is None else f'{steady:,.0f}'} | {gib(run.peak_memory_bytes)} | "
        f"{gib(run.peak_rss_bytes)} | "
        f"{run.load_seconds:.1f} | {status} |"
    )


def markdown(report: Report) -> str:
    """The report as Markdown: machine, training table, ratios, skipped checks."""
    m = report.machine
    lines = [
        f"Command: `{report.command}` ({report.date})",
        "",
        f"- Machine: GPU {m['gpu'] or 'none'} ({gib(m['gpu_memory_bytes'])} GiB), CUDA "
        f"{m['cuda'] or '-'}, torch {m['torch']}, transformers {m['transformers']}, peft "
        f"{m['peft']}; CPU {m['cpu']} ({m['cpu_count']} cores), Python {m['python']}.",
        f"- Data: {report.settings['examples']} chat examples, batch {report.settings['batch']}, "
        f"max_seq_len {report.settings['max_seq_len']} (byte-level tokenizer), LoRA r=8 on "
        "q_proj/v_proj; the trainer's defaults for the device otherwise.",
        "",
        "| model | parameters | mode | device | precision | steps | tokens/s | steady "
        "tokens/s | peak GPU memory, GiB | peak host memory, GiB | load, s | status |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [table_row(report, run) for run in report.training]
    label = "GPU" if report.mode == "gpu" else "smoke (both on the CPU)"
    if report.ratios:
        lines.append("")
    for ratio in report.ratios:
        steady = f" ({ratio['steady_ratio']}x steady)" if ratio["steady_ratio"] else ""
        lines.append(
            f"- `{ratio['model']}` {ratio['mode']}: {label}/CPU tokens/s = "
            f"{ratio['ratio']}x{steady}."
        )
    lines += serving_lines(report.serving)
    lines += ["", "Skipped:", ""]
    lines += [f"- {s['check']}: {s['reason']}." for s in report.skipped]
    return "\n".join(lines)


def serving_lines(results: list[dict[str, Any]]) -> list[str]:
    """The serving runs as Markdown lines."""
    lines: list[str] = []
    for result in results:
        head = f"- {result['check']} ({result['upstream']}): {result['status']}"
        if result["status"] != "ok" and result.get("reason"):
            lines.append(f"{head}: {str(result['reason']).splitlines()[0]}")
        elif "to_checkpoint" in result.get("publish_to_first_response_ms", {}):
            ms = result["publish_to_first_response_ms"]
            lines.append(
                f"{head}; publish to first response from the checkpoint "
                f"({'verified' if result.get('checkpoint_verified') else 'NOT verified'}) "
                f"{ms['to_checkpoint']} ms, back to the base {ms['back_to_base']} ms; "
                f"{result['requests']} requests, {result['failed_requests']} failed"
            )
        elif "publishes" in result:
            ms = result["publish_to_first_response_ms"]
            lines.append(
                f"{head}; {result['publishes']} publishes under {result['concurrency']} "
                f"clients ({result['verified_publishes']} verified before their flip), "
                f"publish to first verified response from the new adapter p50 {ms['p50']} "
                f"ms, p99 {ms['p99']} ms; {result['requests']} requests, "
                f"{result['failed_requests']} failed"
            )
        elif "refused" in result:
            lines.append(
                f"{head}; {'refused' if result['refused'] else 'NOT refused'} at "
                f"{result['dtype']} (tolerance {result['tolerance']:g}; "
                f"{result['decisive_probes']}/{result['probes']} probes start above a near "
                f"tie), the right adapter served on: {result['right_adapter_served_on']}: "
                f"{result['detail']}"
            )
        elif "rows" in result:
            ratios = ", ".join(
                f"{row['adapters']}: {row['tokens_per_second']:,.0f} tokens/s "
                f"({row['vs_base']:.0%})"
                for row in result["rows"]
            )
            note = f" ({result['note']})" if result.get("note") else ""
            lines.append(f"{head}; adapters {ratios}; vendor anchor 98/94/88%{note}")
        else:
            lines.append(f"{head}: {result.get('detail', '')}")
    return ([""] if lines else []) + lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--markdown", type=Path, help="also write the Markdown table here")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny models on the CPU, no CUDA needed"
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=480.0,
        help="runs that would start after this many seconds are skipped (and reported)",
    )
    parser.add_argument(
        "--min-run-seconds",
        type=float,
        default=20.0,
        help="a run is skipped when less than this is left of the budget",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print("no CUDA device here: run with --cpu-smoke for the CPU smoke run", file=sys.stderr)
        return 2
    plan = SMOKE_PLAN if args.cpu_smoke else FULL_PLAN
    command = " ".join(["python bench/gpu_check.py", *(argv if argv is not None else sys.argv[1:])])
    report = Report(
        command=command,
        mode="cpu-smoke" if args.cpu_smoke else "gpu",
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine(),
        settings={
            "batch": plan.batch,
            "max_seq_len": plan.max_seq_len,
            "examples": plan.examples,
            "budget_seconds": args.budget_seconds,
        },
    )
    with tempfile.TemporaryDirectory(prefix="reef-gpu-check-") as scratch:
        checker = Checker(args, plan, report, Path(scratch))
        sources = prepare_models(checker, cuda)
        smollm2 = smollm2_source(checker)
        if smollm2 is not None:
            sources[smollm2] = smollm2
        for job in training_jobs(plan, sources, "cuda" if cuda else "cpu"):
            checker.train(job)
        report.ratios = ratios(report.training)
        checker.skip("embedded engine on CUDA: decode tokens/s at 1 and 8 rows", ENGINE_REASON)
        smallest = Path(sources[plan.shapes["0.5b"].name])
        # two adapters far enough apart that a wrong one changes what the model answers
        # (the serving runs' adapters differ by little: they measure throughput)
        wrong = gpu_serving.make_adapters(smallest, checker.scratch / "fingerprinted", 2, 0.5)
        serving_checks(checker, sources, cuda, wrong)
        ray_check(checker, sources, cuda)
        fingerprint_check(checker, smallest, wrong)
    text = markdown(report)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    failed = [run for run in report.training if run.status == "failed"]
    failed_serving = [result for result in report.serving if result["status"] == "failed"]
    return 1 if failed or failed_serving else 0


if __name__ == "__main__":
    sys.exit(main())
