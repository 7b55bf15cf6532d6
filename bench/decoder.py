"""Bench the engine's forward pass: Hugging Face's model forward, the lean pass
(``reef.engine.decoder``) on separate projections, and the lean pass on fused ones, side
by side in one process, one decode batch each, rounds alternating.

    .venv/bin/python bench/decoder.py --dtype float32,bfloat16,int8 --output docs/benchmarks.md

Prints milliseconds per decode step (median of the rounds) at 1 and 8 rows and each
variant's ratio to Hugging Face's forward, and whether the variants chose the same greedy
tokens in their first steps. One torch thread, as the engine uses on 2 cores. No HTTP,
scheduler or sampling: the forward pass alone (``bench/engine_vs_vllm.py`` measures the
served engine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine()
from sections import write_between

START = "<!-- decoder:start -->"
END = "<!-- decoder:end -->"
VARIANTS = ("Hugging Face forward", "lean, separate projections", "lean, fused projections")
PROMPT = "Write a long story about a dragon who learns to paint. " * 3


def make_batch(
    args: argparse.Namespace, dtype: str, variant: str, rows: int
) -> tuple[Any, list[int]]:
    """A decode batch of ``rows`` copies of the prompt, prefilled, on a fresh model in
    ``dtype`` run the ``variant`` way; and its first 8 greedy tokens (row 0)."""
    import reef.engine.precision as precision
    from reef.engine.adapters import AdapterModel
    from reef.engine.batch import DecodeBatch
    from reef.engine.models import load_model
    from reef.engine.sequences import GenerationJob, SamplingParams, Sequence

    loaded = load_model(args.model, args.home, dtype=precision.load_dtype(dtype))
    fuse = precision.fuse_projections
    if variant != VARIANTS[2]:
        precision.fuse_projections = lambda model: 0  # type: ignore[assignment]
    try:
        precision.apply_precision(loaded.model, dtype)
    finally:
        precision.fuse_projections = fuse
    runner = AdapterModel(loaded.model)
    if variant == VARIANTS[0]:
        runner.lean = None
    prompt = tuple(loaded.tokenizer(PROMPT).input_ids)
    job = GenerationJob(prompt, SamplingParams(max_tokens=10_000), rows, None, print, print)
    batch = DecodeBatch(runner, loaded.model.config)
    tokens = []
    with torch.inference_mode():
        logits = batch.prefill([Sequence(job, i, frozenset()) for i in range(rows)])
        for _ in range(8):
            chosen = logits.argmax(-1)
            tokens.append(int(chosen[0]))
            batch.set_next_tokens(0, chosen)
            logits = batch.step()
    return batch, tokens


def bench_dtype(args: argparse.Namespace, dtype: str, rows: int) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = {variant: make_batch(args, dtype, variant, rows) for variant in VARIANTS}
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with torch.inference_mode():
        for round_ in range(args.rounds):
            order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                batch = made[variant][0]
                started = time.perf_counter()
                for _ in range(args.steps):
                    batch.step()
                times[variant].append((time.perf_counter() - started) / args.steps * 1000)
    medians = {variant: statistics.median(found) for variant, found in times.items()}
    tokens = {variant: made[variant][1] for variant in VARIANTS}
    print(f"{dtype}, {rows} row(s): " + ", ".join(f"{v} {m:.1f} ms" for v, m in medians.items()))
    return {"dtype": dtype, "rows": rows, "ms": medians, "tokens": tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--dtype", default="float32,float16,bfloat16,int8")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--steps", type=int, default=15, help="decode steps per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--output", type=Path, default=None, help="rewrite its section")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [
        bench_dtype(args, dtype, int(rows))
        for dtype in args.dtype.split(",")
        for rows in args.rows.split(",")
    ]
    info = side.machine()
    lines = [
        "## The engine's forward pass (`bench/decoder.py`)",
        "",
        f"Command: `.venv/bin/python bench/decoder.py --dtype {args.dtype} --rows {args.rows} "
        f"--steps {args.steps} --rounds {args.rounds} --output docs/benchmarks.md`. "
        f"{info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date_utc']}; "
        f"{args.model}, one torch thread, the three variants in one process, rounds of "
        f"{args.steps} decode steps alternating; median ms per step over {args.rounds} rounds.",
        "",
        "| dtype | rows | " + " | ".join(VARIANTS) + " | lean / HF | lean fused / HF |",
        "|---|---:|" + "---:|" * (len(VARIANTS) + 2),
    ]
    agree = True
    for found in results:
        ms = found["ms"]
        hf = ms[VARIANTS[0]]
        cells = " | ".join(f"{ms[v]:.1f}" for v in VARIANTS)
        ratios = f"{ms[VARIANTS[1]] / hf:.2f} | {ms[VARIANTS[2]] / hf:.2f}"
        lines.append(f"| {found['dtype']} | {found['rows']} | {cells} | {ratios} |")
        tokens = list(found["tokens"].values())
        agree &= all(t == tokens[0] for t in tokens)
    lines += [
        "",
        "Lower is better; a ratio under 1 is the lean pass being faster. The same first 8 "
        f"greedy tokens in every variant: {'yes' if agree else 'no (see docs/engine.md)'}.",
    ]
    report = "\n".join(lines)
    print(report)
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
