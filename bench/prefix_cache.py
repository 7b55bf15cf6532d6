"""Bench the engine's prompt-prefix cache: a scenario's traffic (one system prompt and
few-shot demos, a different short ticket per request, a short answer) served by the
engine with the cache off and on, side by side in one process.

    .venv/bin/python bench/prefix_cache.py --model smollm2-135m --home .reef

Prints requests/s and prompt tokens prefilled per request for both, the ratio, and
whether every greedy answer was the same with the cache as without (exit 1 if not);
``--output docs/benchmarks.md`` rewrites its section there.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine(), load()
from sections import write_between

START = "<!-- prefix-cache:start -->"
END = "<!-- prefix-cache:end -->"

SYSTEM = (
    "Classify the customer's support message as one of: billing, shipping, technical, "
    "account, cancellation, sales. Answer with the label only."
)
DEMOS = [
    {"role": "user", "content": "Hi, I was billed twice for the Family plan this month."},
    {"role": "assistant", "content": "billing"},
    {"role": "user", "content": "Dear support, please terminate my Business membership today."},
    {"role": "assistant", "content": "cancellation"},
]
SUBJECTS = ["order", "invoice", "password", "parcel", "plan", "refund", "app", "account"]
ISSUES = ["is late", "looks wrong", "does not work", "was charged twice", "is missing"]


def tickets(count: int) -> list[str]:
    """``count`` distinct short tickets."""
    return [
        f"Hello, my {SUBJECTS[i % len(SUBJECTS)]} {ISSUES[i % len(ISSUES)]} (case {1000 + i})."
        for i in range(count)
    ]


async def serve(
    base_url: str, model: str, texts: list[str], concurrency: int, max_tokens: int
) -> tuple[float, list[str]]:
    """Seconds to answer every ticket with ``concurrency`` in flight; the answers."""
    answers: list[str] = [""] * len(texts)
    queue = list(enumerate(texts))
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:

        async def worker() -> None:
            while queue:
                index, text = queue.pop(0)
                response = await client.chat.completions.create(
                    model=model,
                    messages=[
                        {"role": "system", "content": SYSTEM},
                        *DEMOS,
                        {"role": "user", "content": text},
                    ],
                    max_tokens=max_tokens,
                    temperature=0,
                )
                answers[index] = response.choices[0].message.content or ""

        await serve_one(client, model)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, answers


async def serve_one(client: openai.AsyncOpenAI, model: str) -> None:
    """A warm-up request that shares nothing with the tickets' prompts."""
    await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
    )


def run(args: argparse.Namespace, budget_mb: int, texts: list[str]) -> dict[str, Any]:
    """The workload on a fresh engine with ``budget_mb`` of prefix cache."""
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer

    engine = Engine(
        load_model(args.model, args.home),
        threads=args.threads,
        prefix_cache_bytes=budget_mb * 2**20,
    )
    server = BackgroundServer(engine).start()
    try:
        seconds, answers = asyncio.run(
            serve(server.base_url, args.model, texts, args.concurrency, args.max_tokens)
        )
        stats = engine.scheduler.prefix_stats()
    finally:
        server.stop()
    prompt, reused = stats["prompt_tokens"], stats["hit_tokens"]
    return {
        "prefix_cache_mb": budget_mb,
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(texts) / seconds, 3),
        "prompt_tokens_per_request": round(prompt / (len(texts) + 1), 1),
        "prefilled_tokens_per_request": round((prompt - reused) / (len(texts) + 1), 1),
        "answers": answers,
    }


def render(args: argparse.Namespace, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The section of docs/benchmarks.md for ``pairs`` of (off, on) runs."""
    info = side.machine()
    best_off = max(off["requests_per_s"] for off, _ in pairs)
    best_on = max(on["requests_per_s"] for _, on in pairs)
    same = all(off["answers"] == on["answers"] for off, on in pairs)
    rows = [
        f"| {label} | {' / '.join(str(run['requests_per_s']) for run in runs)} | "
        f"{runs[0]['prompt_tokens_per_request']} | {runs[0]['prefilled_tokens_per_request']} |"
        for label, runs in (
            ("off (`prefix_cache_mb: 0`)", [off for off, _ in pairs]),
            ("on (256 MiB, the default)", [on for _, on in pairs]),
        )
    ]
    return "\n".join(
        [
            "### Prompt-prefix cache (`bench/prefix_cache.py`)",
            "",
            "```bash",
            f".venv/bin/python bench/prefix_cache.py --model {args.model} --requests "
            f"{args.requests} --runs {args.runs} --output docs/benchmarks.md",
            "```",
            "",
            f"- Machine: {info.get('cpu')}, {info.get('cores')} cores; load {side.load()}; "
            f"{info.get('date_utc')}. One engine per run, cache off then on, "
            f"{len(pairs)} pair(s).",
            f"- Workload: the quickstart's shape: one system prompt and two few-shot demos, "
            f"{args.requests} distinct one-line tickets, {args.concurrency} in flight, "
            f"greedy, at most {args.max_tokens} tokens each.",
            "",
            "| prefix cache | requests/s (per run) | prompt tokens / request "
            "| prefilled / request |",
            "|---|---:|---:|---:|",
            *rows,
            "",
            f"With the cache: **{best_on / best_off:.2f}x** the requests/s (best run each); "
            f"the same greedy answers with and without it: {'yes' if same else 'NO'}.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2, help="off/on pairs")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    texts = tickets(args.requests)
    pairs = [(run(args, 0, texts), run(args, 256, texts)) for _ in range(args.runs)]
    report = render(args, pairs)
    print(report)
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0 if all(off["answers"] == on["answers"] for off, on in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
