"""Bench the embedded engine: tokens/s at concurrency 1 and 8, time to first token,
adapter load and switch latency.

    .venv/bin/python bench/engine.py --model smollm2-135m --home .reef

``--base-url`` benches an OpenAI-compatible server that is already running instead
(for example vLLM started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), with the same
requests; ``--served-model`` then names its model. ``bench/engine_vs_vllm.py`` runs
these same measurements against the engine and vLLM side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import openai

PROMPT = [{"role": "user", "content": "Write a long story about a dragon who learns to paint."}]
REQUEST_TIMEOUT_S = 120.0  # any one request; every loop below has a fixed count


def make_adapter(model: str, home: Path, directory: Path) -> Path:
    """A rank-8 LoRA on q/v with random weights (its output is irrelevant here)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from reef.engine.models import load_model

    loaded = load_model(model, home)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(
            loaded.model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        )
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.01)
    peft_model.save_pretrained(directory)
    return directory


async def generate(client: openai.AsyncOpenAI, model: str, max_tokens: int) -> int:
    response = await client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0
    )
    return response.usage.completion_tokens if response.usage else 0


async def tokens_per_second(
    client: openai.AsyncOpenAI, model: str, concurrency: int, max_tokens: int, rounds: int
) -> float:
    started = time.perf_counter()
    tokens = 0
    for _ in range(rounds):
        done = await asyncio.gather(
            *(generate(client, model, max_tokens) for _ in range(concurrency))
        )
        tokens += sum(done)
    return tokens / (time.perf_counter() - started)


async def time_to_first_token(client: openai.AsyncOpenAI, model: str) -> float:
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=16, temperature=0, stream=True
    )
    first = 0.0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter() - started
    return first


async def one_token_latency(client: openai.AsyncOpenAI, model: str) -> float:
    started = time.perf_counter()
    await generate(client, model, 1)
    return time.perf_counter() - started


async def run_bench(base_url: str, model: str, adapter: Path | None, args: Any) -> dict[str, Any]:
    results: dict[str, Any] = {"model": model, "base_url": base_url}
    async with (
        openai.AsyncOpenAI(
            base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
        ) as client,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session,
    ):
        await generate(client, model, 4)  # warm up
        results["tokens_per_s_c1"] = await tokens_per_second(
            client, model, 1, args.max_tokens, args.rounds
        )
        results["tokens_per_s_c8"] = await tokens_per_second(
            client, model, 8, args.max_tokens, args.rounds
        )
        ttfts = [await time_to_first_token(client, model) for _ in range(5)]
        results["ttft_ms_median"] = statistics.median(ttfts) * 1000
        if adapter is None:
            return results
        loads = []
        for i in range(5):
            body = {"lora_name": f"bench-{i}", "lora_path": str(adapter)}
            started = time.perf_counter()
            async with session.post(f"{base_url}/load_lora_adapter", json=body) as reply:
                assert reply.status == 200, await reply.text()
            loads.append(time.perf_counter() - started)
        results["adapter_load_ms_median"] = statistics.median(loads) * 1000
        same = [await one_token_latency(client, model) for _ in range(6)]
        switching = [
            await one_token_latency(client, name)
            for _ in range(3)
            for name in ("bench-0", "bench-1")
        ]
        results["one_token_ms_base"] = statistics.median(same) * 1000
        results["one_token_ms_switching_adapters"] = statistics.median(switching) * 1000
        results["switch_overhead_ms"] = (
            results["one_token_ms_switching_adapters"] - results["one_token_ms_base"]
        )
        # A server may defer the weights to the adapter's first request (vLLM does):
        # time a load of a fresh name plus the first 1-token request on it.
        fresh = []
        for i in range(3):
            body = {"lora_name": f"bench-fresh-{i}", "lora_path": str(adapter)}
            started = time.perf_counter()
            async with session.post(f"{base_url}/load_lora_adapter", json=body) as reply:
                assert reply.status == 200, await reply.text()
            await generate(client, f"bench-fresh-{i}", 1)
            fresh.append(time.perf_counter() - started)
        results["adapter_load_first_request_ms_median"] = statistics.median(fresh) * 1000
        names = [f"bench-{i}" for i in range(5)] + [f"bench-fresh-{i}" for i in range(3)]
        for name in names:
            async with session.post(
                f"{base_url}/unload_lora_adapter", json={"lora_name": name}
            ) as reply:
                assert reply.status == 200
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base-url", default=None, help="bench this running server instead")
    parser.add_argument("--served-model", default=None, help="model name at --base-url")
    parser.add_argument("--no-adapter", action="store_true", help="skip the adapter bench")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        adapter = None if args.no_adapter else make_adapter(args.model, args.home, Path(scratch))
        if args.base_url:
            model = args.served_model or args.model
            results = asyncio.run(run_bench(args.base_url, model, adapter, args))
        else:
            from reef.engine.models import load_model
            from reef.engine.runtime import Engine
            from reef.engine.server import BackgroundServer

            engine = Engine(load_model(args.model, args.home), threads=args.threads)
            server = BackgroundServer(engine).start()
            try:
                results = asyncio.run(run_bench(server.base_url, args.model, adapter, args))
            finally:
                server.stop()
            results["threads"] = engine.scheduler.threads
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
