"""The embedded engine in float32, float16, bfloat16 and int8, side by side in one run: decode
tokens/s at concurrency 1 and 8, the memory-bandwidth bound of each (a STREAM-style
read of the weights' size), greedy answers against float32's, and a LoRA adapter
served in each.

    .venv/bin/python bench/engine_dtypes.py --model smollm2-135m --threads 1 --runs 2 \
        --output docs/benchmarks.md

Each run starts an in-process engine (``BackgroundServer``) per dtype, in alternating
order, and measures it with the requests of ``bench/engine.py``. The bound: decoding
one token reads every weight once, so tokens/s cannot pass (bytes read per second) /
(weight bytes); the read rate is measured here by summing a tensor of the weights' size
(float32, else bfloat16: int8 weights are counted in bytes) with the engine's threads
(the best of a few passes). ``products``: the tokens/s the weight products alone
allow (each projection and the output head on one row, timed alone), the ceiling the
dtype's kernels set under the bound. ``greedy_equal``: of ``--prompts`` fixed prompts answered
greedily (32 tokens), how many float16 (bfloat16, int8) answers equal float32's token for
token, and where the first differs on average. float16 holds the projections' weights
in float16 for fbgemm, with float32 activations; int8 is weight-only: the decoder
layers' weights in int8, activations in bfloat16 (``reef.engine.precision``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine(), load(), weight reads
from sections import write_between

import engine as engine_bench  # bench/engine.py: make_adapter, tokens_per_second

START = "<!-- engine-dtypes:start -->"
END = "<!-- engine-dtypes:end -->"
DTYPES = ("float32", "float16", "bfloat16", "int8")
PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
    "How do I boil an egg?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Name a planet.",
    "Give me a tip for sleeping better.",
]


def products_alone(model: Any, threads: int, passes: int = 10) -> float:
    """Tokens/s if a decoded token cost only its weight products: every projection and
    the output head applied to one row, as the engine holds them (fused, packed, int8 or
    float16 layers; a fused layer's slices are not called again), timed alone with
    ``threads`` (median of ``passes``). The ceiling the product kernels set, under the
    bandwidth bound: the norms, attention, sampling and serving come on top."""
    import torch
    from torch import nn

    from reef.engine.decoder import SliceLinear
    from reef.engine.precision import precision_of

    torch.set_num_threads(threads)
    activation = torch.float32 if precision_of(model) in ("float32", "float16") else torch.bfloat16
    layers = [
        m for m in model.modules() if isinstance(m, nn.Linear) and not isinstance(m, SliceLinear)
    ]
    inputs = {m.in_features: torch.randn(1, 1, m.in_features).to(activation) for m in layers}
    times = []
    with torch.inference_mode():
        for _ in range(passes + 2):
            started = time.perf_counter()
            for layer in layers:
                layer(inputs[layer.in_features])
            times.append(time.perf_counter() - started)
    return 1 / statistics.median(times[2:])


async def greedy_answers(base_url: str, model: str, count: int) -> list[list[str]]:
    """The first 32 tokens of each prompt's greedy answer, as logprob tokens."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        answers = []
        for prompt in PROMPTS[:count]:
            reply = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=32,
                temperature=0,
                logprobs=True,
            )
            content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else []
            answers.append([entry.token for entry in content or []])
        return answers


async def measure(base_url: str, model: str, adapter: Path, args: Any) -> dict[str, Any]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        await engine_bench.generate(client, model, 4)  # warm up
        c1 = await engine_bench.tokens_per_second(client, model, 1, args.max_tokens, args.rounds)
        c8 = await engine_bench.tokens_per_second(client, model, 8, args.max_tokens, args.rounds)
        loaded = await client.post(
            "/load_lora_adapter",
            body={"lora_name": "bench-lora", "lora_path": str(adapter)},
            cast_to=str,
        )
        adapter_c1 = await engine_bench.tokens_per_second(
            client, "bench-lora", 1, args.max_tokens, 1
        )
    greedy = await greedy_answers(base_url, model, args.prompts)
    return {"c1": c1, "c8": c8, "adapter_c1": adapter_c1, "loaded": bool(loaded), "greedy": greedy}


def one_run(args: argparse.Namespace, order: tuple[str, ...], adapter: Path) -> dict[str, Any]:

    from reef.engine.models import load_model
    from reef.engine.precision import apply_precision, load_dtype
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer

    out: dict[str, Any] = {}
    for name in order:
        dtype = load_dtype(name)
        loaded = load_model(args.model, args.home, dtype=dtype)
        apply_precision(loaded.model, name)
        weight_bytes = side.decode_bytes(loaded.model)
        products = products_alone(loaded.model, args.threads)
        engine = Engine(loaded, threads=args.threads)
        server = BackgroundServer(engine).start()
        try:
            result = asyncio.run(measure(server.base_url, args.model, adapter, args))
        finally:
            server.stop()
        result.update(side.bound_figures(weight_bytes, dtype, engine.scheduler.threads))
        result["threads"] = engine.scheduler.threads
        result["products"] = products
        out[name] = result
        print(name, {k: v for k, v in result.items() if k != "greedy"}, flush=True)
    return out


def greedy_agreement(runs: list[dict[str, Any]], name: str) -> tuple[int, int, float | None]:
    """(answers equal, answers compared, mean position of the first differing token
    over the answers that differ: None when none does) of ``name`` against float32,
    over the first run. An answer that ends early (end of sequence) and equals
    float32's up to there counts as equal."""
    ours, theirs = runs[0][name]["greedy"], runs[0]["float32"]["greedy"]
    equal = sum(a == b for a, b in zip(ours, theirs, strict=True))
    firsts = []
    for a, b in zip(ours, theirs, strict=True):
        if a == b:
            continue
        differ = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        firsts.append(next(differ, min(len(a), len(b))))
    return equal, len(ours), statistics.fmean(firsts) if firsts else None


def render(args: argparse.Namespace, runs: list[dict[str, Any]]) -> str:
    info = side.machine()

    def median(name: str, key: str) -> float:
        return statistics.median(run[name][key] for run in runs)

    rows = []
    for name in args.dtypes:
        c1, bound = median(name, "c1"), median(name, "bound")
        products = median(name, "products")
        rows.append(
            f"| {name} | {median(name, 'weight_mb'):.0f} | {median(name, 'read_gb_s'):.1f} "
            f"| {bound:.1f} | {products:.1f} | {products / bound:.2f} | {c1:.1f} "
            f"| {c1 / bound:.2f} | {median(name, 'c8'):.1f} "
            f"| {median(name, 'adapter_c1'):.1f} |"
        )
    lines = []
    for name in args.dtypes[1:]:
        equal, compared, first = greedy_agreement(runs, name)
        speed = median(name, "c1") / median("float32", "c1")
        speed8 = median(name, "c8") / median("float32", "c8")
        lines.append(
            f"- {name} decodes **{speed:.2f}x** float32's tokens/s at concurrency 1 and "
            f"{speed8:.2f}x at 8. Greedy answers: {equal} of {compared} prompts equal "
            f"float32's for 32 tokens"
            + (
                f"; where one differs, the first differing token is at {first:.1f} on average"
                if first is not None
                else ""
            )
            + f" ({name} is approximate: docs/engine.md)."
        )
    return "\n".join(
        [
            "### Engine precision (`bench/engine_dtypes.py`)",
            "",
            "```bash",
            f".venv/bin/python bench/engine_dtypes.py --model {args.model} --threads "
            f"{args.threads} --runs {args.runs} --dtype {','.join(args.dtypes)} "
            "--output docs/benchmarks.md",
            "```",
            "",
            f"- Machine: {info.get('cpu')} ({info.get('vector')}), {info.get('cores')} "
            "cores, engine threads "
            f"{runs[0]['float32']['threads']}; load {side.load()}; medians of {len(runs)} "
            "runs, order alternating.",
            *lines,
            "- bound: the read rate over the weights' bytes, the most tokens/s one decode "
            "stream can reach; c1/bound is how close the engine gets. products: tokens/s "
            "if a token cost only its weight products (every projection and the head on "
            "one row, timed alone): the ceiling torch's kernels for that dtype set, before "
            "any other op of the step.",
            "",
            "| dtype | weights MB | read GB/s | bound tok/s | products tok/s | products/bound "
            "| c1 tok/s | c1/bound | c8 tok/s | c1 tok/s with a LoRA |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument(
        "--dtype", default=",".join(DTYPES), help="precisions, comma-separated; float32 always"
    )
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    asked = [name for name in args.dtype.split(",") if name and name != "float32"]
    unknown = sorted(set(asked) - set(DTYPES))
    if unknown:
        parser.error(f"--dtype: unknown {', '.join(unknown)}; choose from {', '.join(DTYPES)}")
    args.dtypes = ("float32", *asked)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        adapter = engine_bench.make_adapter(args.model, args.home, Path(scratch))
        for number in range(args.runs):
            order = args.dtypes if number % 2 == 0 else args.dtypes[::-1]
            runs.append(one_run(args, order, adapter))
    report = render(args, runs)
    print(report)
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
