"""Bench the packaged model's one-time GGUF -> safetensors conversion: Reef's direct
converter (``reef.engine.gguf``) against transformers' ``gguf_file=`` loading (what
``smollm2_cache`` used before), side by side in one process, order alternating.

    .venv/bin/python bench/gguf_convert.py --runs 2 --output docs/benchmarks.md

Prints seconds per conversion for both, the ratio, and whether the two wrote the same
tensors (exit 1 if not). Each run converts into a fresh temporary directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine()
from sections import write_between

START = "<!-- gguf-convert:start -->"
END = "<!-- gguf-convert:end -->"


def with_transformers(gguf: Path, destination: Path) -> None:
    """The conversion ``smollm2_cache`` ran before ``reef.engine.gguf``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    setattr(model, "hf_quantizer", None)  # noqa: B010 -- weights are already float32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(destination, safe_serialization=True)
    tokenizer.save_pretrained(destination)


def timed(convert: Callable[[Path, Path], None], gguf: Path, destination: Path) -> float:
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert(gguf, destination)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None, help="rewrite its section")
    args = parser.parse_args()

    from reef.engine.gguf import convert_gguf
    from reef.engine.models import smollm2_gguf

    gguf = smollm2_gguf()
    targets = {"reef.engine.gguf": convert_gguf, "transformers gguf_file=": with_transformers}
    seconds: dict[str, list[float]] = {name: [] for name in targets}
    same = True
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.runs):
            order = list(targets) if run % 2 == 0 else list(reversed(targets))
            written = {}
            for name in order:
                destination = Path(scratch) / f"{run}-{len(written)}"
                seconds[name].append(timed(targets[name], gguf, destination))
                written[name] = load_file(str(destination / "model.safetensors"))
                print(f"run {run + 1}/{args.runs}: {name} {seconds[name][-1]:.1f} s")
            ours, theirs = written.values()
            same &= sorted(ours) == sorted(theirs) and all(
                torch.equal(ours[key], theirs[key]) for key in ours
            )
    ours_s = statistics.median(seconds["reef.engine.gguf"])
    theirs_s = statistics.median(seconds["transformers gguf_file="])
    info = side.machine()
    report = "\n".join(
        [
            "## GGUF conversion of the packaged model (`bench/gguf_convert.py`)",
            "",
            f"Command: `.venv/bin/python bench/gguf_convert.py --runs {args.runs} "
            "--output docs/benchmarks.md`. "
            f"{info['cores']} cores, {info['cpu']}, Python {info['python']}, "
            f"{info['date_utc']}; {gguf.name}, median of {args.runs} run(s), order "
            "alternating, each into a fresh directory.",
            "",
            "| converter | seconds | vs transformers |",
            "|---|---:|---:|",
            f"| `reef.engine.gguf` (one read) | {ours_s:.1f} | {ours_s / theirs_s:.2f} |",
            f"| transformers `gguf_file=` + `save_pretrained` | {theirs_s:.1f} | 1.00 |",
            "",
            f"Same tensors, bit for bit: {'yes' if same else 'NO'}.",
        ]
    )
    print(report)
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
