"""The engine section of docs/benchmarks.md, from ``bench/engine_vs_vllm.py``'s JSON report.

    .venv/bin/python bench/engine_vs_vllm.py --model smollm2-135m --home .reef --runs 2 \
        --output engine.json
    .venv/bin/python bench/engine_report.py engine.json --output docs/benchmarks.md

``python -m bench --only engine`` runs both. The section names the command, the machine and
the versions, and gives every figure with the ratio engine/vLLM measured in the same
run (or says why vLLM was not benched). Without ``--output`` it only prints it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from sections import write_between

START = "<!-- engine:start -->"
END = "<!-- engine:end -->"
_HOW_TO_READ = (
    "How to read it: each figure is the median over runs; the ratio is engine/vLLM from "
    "the same invocation, so both sides saw the same machine and the same minutes, and "
    "*better* says which direction wins. Each server is a child process started fresh for "
    "each run and stopped after it; the two never run at the same time and their order "
    "alternates between runs. On a shared machine absolute figures move from run to run; "
    "the ratios carry over better. docs/engine.md discusses what the figures mean."
)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _loads(runs: list[dict[str, Any]]) -> str:
    """Each run's load average before it; an OpenVINO run's named (the others are eager)."""
    return (
        "; ".join(
            (f"openvino {run.get('dtype')} " if run.get("backend") == "openvino" else "")
            + str(run.get("load_before", "?"))
            for run in runs
        )
        or "none"
    )


def _script_command(command: str) -> str:
    """engine_vs_vllm.py's command line without its scratch ``--output`` file."""
    words = shlex.split(command)
    if "--output" in words:
        at = words.index("--output")
        del words[at : at + 2]
    return shlex.join(["python", *words])


def markdown(report: dict[str, Any], command: str) -> str:
    """The section (markers excluded) for ``report``."""
    info, settings = report["machine"], report.get("settings", {})
    engine_runs, vllm_runs = report.get("engine_runs", []), report.get("vllm_runs", [])
    packages = ("torch", "transformers", "peft")
    if report.get("openvino_bounds"):
        packages += ("openvino", "openvino-genai")
    engine_versions = ", ".join(f"{name} {_version(name)}" for name in packages)
    lines = [
        "## Embedded engine vs vLLM (CPU)",
        "",
        f"Command: `{command}`, which runs `{_script_command(report['command'])}` and renders its "
        "JSON report with `bench/engine_report.py`. vLLM comes from its own environment "
        "(`bench/.venv-vllm`, see [engine.md](engine.md#vllm-side-by-side)).",
        "",
        f"- Machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, Linux "
        f"{info['kernel']}; {info['date_utc']}.",
        f"- Load average before each target (1, 5, 15 min): engine {_loads(engine_runs)}; "
        f"vLLM {_loads(vllm_runs)}.",
        f"- Versions: engine on {engine_versions}; vLLM: "
        f"{report.get('vllm_versions', 'not benched')}.",
        f"- Requests: chat, temperature 0, {settings.get('max_tokens', '?')}-token answers, "
        f"{settings.get('rounds', '?')} round(s) per concurrency, {settings.get('runs', '?')} "
        "run(s).",
    ]
    if vllm_runs:
        flags = f"--enable-lora --max-lora-rank 8 {settings.get('vllm_args', '')}"
        env = " ".join(f"{key}={value}" for key, value in settings.get("vllm_env", {}).items())
        lines.append(
            f"- vLLM: flags `{flags}`, dtype {settings.get('vllm_dtype', '?')}, model "
            f"directory `{report.get('vllm_model_dir')}`, environment `{env}`."
        )
    if "same_greedy_text" in report:
        same = "the same" if report["same_greedy_text"] else "different"
        lines.append(f"- Both gave {same} greedy 24-token answer.")
    dtypes = report.get("engine_dtypes", [settings.get("engine_dtype", "float32")])
    theirs = report.get("vllm_dtypes", [settings.get("vllm_dtype", "?")])
    backends = list(dict.fromkeys(t[0] for t in report.get("engine_targets", []))) or ["eager"]
    lead = (
        f"Engine {dtypes[0]}"
        if backends == ["eager"]
        else ("Each backend at its first dtype (" + ", ".join(backends) + ")")
    )
    lines += ["", f"{lead} against vLLM {theirs[0]}:", "", report["table"], ""]
    if "dtype_table" in report:
        lines += [
            "Every precision (median tok/s over runs; bound: the weights' bytes against the "
            "read rate of a tensor that size with the engine's threads, the most one decode "
            "stream can reach; switch: what alternating two adapters adds to a 1-token "
            "request; agreement: greedy answers equal to PEFT's, base model and under a "
            "LoRA):",
            "",
            report["dtype_table"],
            "",
            "Targets (issue 16 for the eager engine, issue 45 for OpenVINO):"
            if report.get("openvino_bounds")
            else "Targets (issue 16):",
            "",
            *report["targets"],
            "",
        ]
    for label, why in report.get("engine_skipped", {}).items():
        lines += [f"{label} not benched: {str(why).strip().splitlines()[0]}", ""]
    if report.get("vllm_unavailable"):
        reason = str(report["vllm_unavailable"]).strip().splitlines()[0]
        lines += [f"vLLM not benched: {reason}; no ratio this time.", ""]
    lines.append(_HOW_TO_READ)
    return "\n".join(lines)


def write_section(path: Path, text: str) -> None:
    """Replace this bench's section of ``path`` (appended when absent)."""
    write_between(path, START, END, text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("report", type=Path, help="engine_vs_vllm.py --output JSON")
    parser.add_argument("--output", type=Path, default=None, help="markdown to rewrite")
    parser.add_argument("--command", default="python -m bench --only engine", help="shown as run")
    args = parser.parse_args(argv)
    text = markdown(json.loads(args.report.read_text(encoding="utf-8")), args.command)
    print(text)
    if args.output is not None:
        write_section(args.output, text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
