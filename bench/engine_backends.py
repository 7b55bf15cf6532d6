"""Candidate CPU runtimes for a second engine backend, against the eager engine, in one
process run: decode ms/token at concurrency 1, aggregate tokens/s at concurrency 8,
greedy agreement with PEFT under a LoRA adapter, and the adapter switch.

    nice -n 19 python bench/engine_backends.py --model smollm2-135m --home .reef \
        --runtimes eager,openvino --precisions fp32,fp16,int8,int4 --output result.json

What is measured, the same for every target (a runtime at a weight precision):

A precision ``fp32-f32`` is the fp32 IR computed as the backend serves it: float32
arithmetic and a float32 KV cache (``reef.engine.openvino.PIPELINE_PROPERTIES``); without
``-f32`` the pipeline computes as OpenVINO chooses (bfloat16 activations on a CPU with
AVX-512 BF16 or AMX, keys and values in u8). ``--ov-properties`` adds or overrides
properties.

- ``c1_ms``: decode time per token at concurrency 1, greedy, a ``--prompt-tokens`` prompt
  and ``--max-tokens`` new tokens with end-of-sequence ignored (every run decodes the
  same count): (time for ``--max-tokens`` tokens - time for 1 token) / (``--max-tokens`` - 1),
  so the prompt's prefill is left out; median of ``--rounds``.
- ``c8_tok_s``: 8 such requests at once (eight different prompts), generated tokens / wall
  time, prefill included.
- ``bound_tok_s``: the memory-bandwidth bound: a decoded token reads every weight once, so
  tokens/s at concurrency 1 cannot pass (bytes read per second) / (weight bytes). The read
  rate is that of summing a tensor of the weights' size (``engine_vs_vllm.read_rate``);
  the weight bytes are the runtime's weight file (the eager engine's: its tensors).
- ``agree``: a rank-8 PEFT LoRA on every projection with seeded random weights (``lora_B``
  drawn with std ``--lora-std``, strong enough to change most greedy answers of the base
  model, reported as ``lora_changes``) answers ``--prompts`` chat prompts greedily with
  PEFT in float32 (up to 32 tokens, ending at the end of the turn as a served answer
  does); the runtime serves the same adapter from its safetensors and answers the same
  token ids; ``agree`` is the share of answers equal token for token.
  ``base_agree``: the same against the base model without adapter.
- ``switch_ms``: a 1-token request on adapter A right after one on adapter B, less a
  1-token request on A after one on A (median of 10 pairs): what changing adapter adds.

Conversion is offline, from the safetensors cache Reef makes of the packaged GGUF
(``reef.engine.models.smollm2_cache``): OpenVINO through ``optimum-cli export openvino``
(optimum-intel; weights in fp32, fp16, int8 or int4, nncf's weight-only compression),
ONNX Runtime GenAI through its model builder. Converted models are cached under
``<home>/models/bench-<runtime>-<precision>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine(), read_rate()

STORY = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps "
    "as his father had taught him, and at the top he wiped the great lens with a soft cloth "
    "before lighting the lamp. Ships passed far out at sea, their lights small and steady, "
    "and he wrote each one into the logbook with the hour and the direction of the wind. "
    "One night a storm rolled in from the west, and the sea rose higher than he had ever "
    "seen it, and the waves broke against the rocks below with a sound like thunder. "
    "He kept the lamp burning through the night, and in the morning a small boat drifted "
    "into the cove with a girl asleep in it, wrapped in a sailcloth. "
)


def long_prompts(tokenizer: Any, count: int, length: int) -> list[list[int]]:
    """``count`` different prompts of exactly ``length`` token ids: the chat template
    around a numbered story, cut to length in the middle, so each keeps its start (the
    role header and its number, where the prompts differ: a prefix cache cannot answer
    one prompt's prefill from another's) and its end (the assistant turn)."""
    prompts = []
    for i in range(count):
        text = f"Part {i + 1}. " + STORY * 4 + " Continue the story."
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        ids = [int(t) for t in ids]
        head = min(length // 2, len(ids))
        prompts.append(ids[:head] + ids[len(ids) - (length - head) :])
    return prompts


def chat_ids(tokenizer: Any, chats: list[list[dict[str, Any]]]) -> list[list[int]]:
    """Each chat's token ids under the chat template, ending on the assistant turn."""
    return [
        [
            int(t)
            for t in tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        ]
        for chat in chats
    ]


# --- the eager engine ----------------------------------------------------------------


class EagerTarget:
    """Reef's engine (``reef.engine.runtime.Engine``) called in-process, end of sequence
    ignored (an engine whose model has no EOS id)."""

    def __init__(self, model: str, home: Path, threads: int | None) -> None:
        from reef.engine.models import LoadedModel, load_model
        from reef.engine.runtime import Engine

        loaded = load_model(model, home)
        self.loaded = LoadedModel(loaded.model, loaded.tokenizer, loaded.name, frozenset())
        self.engine = Engine(self.loaded, max_batch=16, threads=threads)
        self.loop = asyncio.new_event_loop()
        self.engine.start()
        self.weight_bytes = side.decode_bytes(self.loaded.model)
        self.threads = self.engine.scheduler.threads

    def close(self) -> None:
        self.engine.stop()
        self.loop.close()

    async def _one(self, ids: list[int], max_tokens: int, model: str) -> list[int]:
        from reef.engine.sequences import SamplingParams

        lease = self.engine.lease(model)
        stream = self.engine.generate(
            ids, SamplingParams(max_tokens=max_tokens, temperature=0.0), 1, lease
        )
        out: list[int] = []
        async for delta in stream:
            out.extend(delta.token_ids)
        return out

    def generate(self, prompts: list[list[int]], max_tokens: int, adapter: str | None = None):
        model = adapter or self.engine.name

        async def run() -> list[list[int]]:
            return list(await asyncio.gather(*(self._one(p, max_tokens, model) for p in prompts)))

        return self.loop.run_until_complete(run())

    def load_adapter(self, name: str, path: Path) -> None:
        self.loop.run_until_complete(self.engine.load_adapter(name, path, None, replace=True))


# --- OpenVINO GenAI ------------------------------------------------------------------


def openvino_convert(source: Path, target: Path, precision: str, cli: str) -> Path:
    """``optimum-cli export openvino`` of ``source`` into ``target`` (once). ``cli`` is the
    optimum-cli to run: optimum-intel 2.2 needs transformers < 5.6, below Reef's floor,
    so it lives in an environment of its own."""
    if (target / "openvino_model.xml").is_file():
        return target
    formats = {"fp32": "fp32", "fp16": "fp16", "int8": "int8", "int4": "int4"}
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".convert.", dir=target.parent))
    command = [
        cli, "export", "openvino",
        "--model", str(source), "--task", "text-generation-with-past",
        "--weight-format", formats[precision],
    ]  # fmt: skip
    if precision == "int4":
        command += ["--group-size", "64", "--ratio", "1.0", "--sym"]
    command.append(str(scratch))
    started = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    os.replace(scratch, target)
    print(f"converted {precision} in {time.perf_counter() - started:.1f} s", flush=True)
    return target


class OpenVINOTarget:
    """An OpenVINO GenAI ``ContinuousBatchingPipeline`` on the converted model, the
    adapters it is given registered at construction and chosen per call."""

    def __init__(
        self,
        directory: Path,
        threads: int | None,
        adapters: dict[str, Path],
        f32: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        import openvino as ov
        import openvino_genai as ov_genai

        self.ov, self.genai = ov, ov_genai
        self.adapters = {
            name: ov_genai.Adapter(str(path / "adapter_model.safetensors"))
            for name, path in adapters.items()
        }
        self.alpha = {name: lora_scale(path) for name, path in adapters.items()}
        config = ov_genai.AdapterConfig()
        for name, adapter in self.adapters.items():
            config.add(adapter, self.alpha[name])
        properties: dict[str, Any] = {"adapters": config}
        if threads:
            properties["INFERENCE_NUM_THREADS"] = threads
        if f32:  # as the backend serves: float32 arithmetic and KV cache
            from reef.engine.openvino import PIPELINE_PROPERTIES

            properties.update(PIPELINE_PROPERTIES)
        properties.update(extra or {})
        scheduler = ov_genai.SchedulerConfig()
        scheduler.cache_size = 1  # GB of KV cache
        scheduler.max_num_batched_tokens = 4096
        scheduler.enable_prefix_caching = False
        self.pipe = ov_genai.ContinuousBatchingPipeline(
            str(directory), ov_genai.Tokenizer(str(directory)), scheduler, "CPU", **properties
        )
        self.weight_bytes = (directory / "openvino_model.bin").stat().st_size
        self.threads = threads or 0
        self.next_id = 0

    def close(self) -> None:
        del self.pipe

    def _config(self, max_tokens: int, adapter: str | None, served: bool = False) -> Any:
        """Greedy, ``max_tokens`` new tokens; end of sequence ignored (the speed runs
        decode the same count) unless ``served``: then it ends the answer, as it does
        when the backend serves (the agreement)."""
        config = self.genai.GenerationConfig()
        config.max_new_tokens = max_tokens
        if not served:
            config.min_new_tokens = max_tokens
            config.ignore_eos = True
        config.do_sample = False
        config.adapters = (
            self.genai.AdapterConfig(self.adapters[adapter], self.alpha[adapter])
            if adapter
            else self.genai.AdapterConfig()
        )
        return config

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        adapter: str | None = None,
        served: bool = False,
    ):
        """One ``generate`` call: the pipeline batches the prompts (its continuous
        batching). The adapter is the call's: OpenVINO GenAI 2026.4 applies LoRA per call
        ("LoRA adapters value must be the same for all requests"), and requests added
        with ``add_request`` run on whatever the last call applied."""
        import numpy as np

        config = self._config(max_tokens, adapter, served)
        tensors = [self.ov.Tensor(np.array([ids], dtype=np.int64)) for ids in prompts]
        results = self.pipe.generate(tensors, [config] * len(tensors))
        return [list(result.m_generation_ids[0]) for result in results]


def lora_scale(path: Path) -> float:
    """PEFT's scale of an adapter: ``lora_alpha / r``."""
    config = json.loads((path / "adapter_config.json").read_text())
    return float(config["lora_alpha"]) / float(config["r"])


# --- measurements --------------------------------------------------------------------


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def speed(target: Any, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    """``c1_ms`` and ``c8_tok_s`` (module docstring)."""
    target.generate(prompts[:1], 8)  # warm up
    target.generate(prompts[:8], 8)
    per_token = []
    for _ in range(args.rounds):
        one = timed(lambda: target.generate(prompts[:1], 1))
        full = timed(lambda: target.generate(prompts[:1], args.max_tokens))
        per_token.append((full - one) / (args.max_tokens - 1))
    rates = []
    for _ in range(args.rounds):
        seconds = timed(lambda: target.generate(prompts[:8], args.max_tokens))
        rates.append(8 * args.max_tokens / seconds)
    return {"c1_ms": statistics.median(per_token) * 1000, "c8_tok_s": statistics.median(rates)}


def agreement(answers: list[list[int]], reference: list[list[int]]) -> float:
    if not reference:
        return 0.0
    return sum(a == r for a, r in zip(answers, reference, strict=True)) / len(reference)


def switch_ms(target: Any, prompt: list[int], a: str, b: str) -> float:
    same, switched = [], []
    for _ in range(10):
        target.generate([prompt], 1, a)
        same.append(timed(lambda: target.generate([prompt], 1, a)))
        target.generate([prompt], 1, b)
        switched.append(timed(lambda: target.generate([prompt], 1, a)))
    return (statistics.median(switched) - statistics.median(same)) * 1000


def make_adapter(model: Any, directory: Path, seed: int, std: float) -> Path:
    """A rank-8 LoRA on every projection with seeded random ``lora_B`` (std ``std``)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=std)
    peft_model.save_pretrained(directory)
    peft_model.unload()  # type: ignore[operator]
    return directory


def peft_answers(
    model_name: str, home: Path, adapter: Path | None, prompts: list[list[int]], tokens: int
) -> list[list[int]]:
    """Greedy answers of PEFT (float32, HF generate) with ``adapter``, or the base model."""
    import torch
    from peft import PeftModel

    from reef.engine.models import load_model

    torch.set_num_threads(1)  # on a small shared machine more threads only wait on each other
    loaded = load_model(model_name, home)
    model: Any = loaded.model
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    out = []
    with torch.inference_mode():
        for ids in prompts:
            generated = model.generate(
                torch.tensor([ids]),
                max_new_tokens=tokens,
                do_sample=False,
                eos_token_id=sorted(loaded.eos_token_ids),
                pad_token_id=0,
            )
            out.append(until_eos([int(t) for t in generated[0, len(ids) :]], loaded.eos_token_ids))
    return out


def until_eos(answer: list[int], eos: frozenset[int]) -> list[int]:
    """``answer`` up to its first end-of-sequence token (left out): the answer as served.
    The agreement compares these: forcing tokens past the end of the turn is not
    serving, and runtimes differ there (OpenVINO's ``min_new_tokens`` masks the end
    token, PyTorch's generate without an ``eos_token_id`` does not)."""
    for index, token in enumerate(answer):
        if token in eos:
            return answer[:index]
    return answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--runtimes", default="eager,openvino")
    parser.add_argument("--precisions", default="fp32,fp16,int8,int4")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--lora-std", type=float, default=0.02)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-lora", action="store_true", help="speed only: no PEFT answers")
    parser.add_argument(
        "--ov-properties",
        type=json.loads,
        default={},
        help='more OpenVINO properties, JSON (e.g. \'{"KV_CACHE_PRECISION": "f32"}\')',
    )
    parser.add_argument("--optimum-cli", default="optimum-cli", help="optimum-intel's CLI")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from reef.engine.choice import probe_chats  # the prompts of ``--backend auto``'s check
    from reef.engine.models import DEFAULT_MODEL, load_model, smollm2_cache

    source = smollm2_cache(args.home) if args.model == DEFAULT_MODEL else Path(args.model)
    loaded = load_model(args.model, args.home)
    tokenizer = loaded.tokenizer
    args.eos = loaded.eos_token_ids  # the answers end there (``until_eos``)
    prompts = long_prompts(tokenizer, 8, args.prompt_tokens)
    chats = chat_ids(tokenizer, probe_chats(args.prompts))
    work = Path(tempfile.mkdtemp(prefix="reef-backends-"))
    adapter_a = make_adapter(loaded.model, work / "lora-a", 1, args.lora_std)
    adapter_b = make_adapter(
        load_model(args.model, args.home).model, work / "lora-b", 2, args.lora_std
    )
    del loaded
    started = time.perf_counter()
    reference = {
        "base": [] if args.skip_lora else peft_answers(args.model, args.home, None, chats, 32),
        "a": [] if args.skip_lora else peft_answers(args.model, args.home, adapter_a, chats, 32),
    }
    print(f"PEFT answers in {time.perf_counter() - started:.1f} s", flush=True)
    lora_changes = 1 - agreement(reference["a"], reference["base"])
    results: dict[str, Any] = {
        "machine": side.machine(),
        "command": " ".join(sys.argv),
        "lora_changes": lora_changes,
        "targets": {},
    }
    adapters = {"a": adapter_a, "b": adapter_b}
    for runtime in args.runtimes.split(","):
        precisions = ["fp32"] if runtime == "eager" else args.precisions.split(",")
        for precision in precisions:
            label = f"{runtime}-{precision}"
            try:
                target = open_target(runtime, precision, source, args, adapters)
            except Exception as exc:
                print(f"{label}: cannot start: {exc!r}", flush=True)
                results["targets"][label] = {"error": repr(exc)}
                continue
            row: dict[str, Any] = {"load_avg": os.getloadavg()[0]}
            try:
                if not args.skip_speed:
                    row.update(speed(target, prompts, args))
                rate = side.read_rate(target.weight_bytes, bound_dtype(), target.threads or 1)
                row.update(
                    weight_mb=target.weight_bytes / 1e6, bound_tok_s=rate / target.weight_bytes
                )
                for name, path in getattr(target, "adapter_paths", {}).items():
                    target.load_adapter(name, path)
                if args.skip_lora:
                    raise _SpeedOnly
                base = target.generate_each(chats, 32, None)
                row["base_agree"] = agreement(base, reference["base"])
                row["agree"] = agreement(target.generate_each(chats, 32, "a"), reference["a"])
                row["switch_ms"] = switch_ms(target, chats[0], "a", "b")
            except _SpeedOnly:
                pass
            except Exception as exc:
                print(f"{label}: failed: {exc!r}", flush=True)
                row["error"] = repr(exc)
            finally:
                target.close()
            results["targets"][label] = row
            print(label, json.dumps(row), flush=True)
            if args.output:
                args.output.write_text(json.dumps(results, indent=2))
    print(table(results))
    return 0


class _SpeedOnly(Exception):
    """--skip-lora: the target's row ends after its speed figures."""


def bound_dtype() -> Any:
    import torch

    return torch.float32


def open_target(
    runtime: str, precision: str, source: Path, args: argparse.Namespace, adapters: dict[str, Path]
) -> Any:
    if runtime == "eager":
        # adapters load after the speed runs: once one is resident every forward pass
        # goes through PEFT's per-row routing, which is not the base model's speed
        target: Any = EagerTarget(args.model, args.home, args.threads)
        target.adapter_paths = adapters
    elif runtime == "openvino":
        weights = precision.removesuffix("-f32")
        directory = openvino_convert(
            source, args.home / "models" / f"bench-openvino-{weights}", weights, args.optimum_cli
        )
        target = OpenVINOTarget(
            directory, args.threads, adapters, precision.endswith("-f32"), args.ov_properties
        )
    else:
        raise ValueError(f"unknown runtime {runtime!r}")

    eos = args.eos

    def each(chats: list[list[int]], tokens: int, adapter: str | None) -> list[list[int]]:
        if runtime == "openvino":
            answers = [target.generate([ids], tokens, adapter, served=True)[0] for ids in chats]
        else:  # the eager target ignores end of sequence: its answers are cut below
            answers = [target.generate([ids], tokens, adapter)[0] for ids in chats]
        return [until_eos(answer, eos) for answer in answers]

    target.generate_each = each
    return target


def table(results: dict[str, Any]) -> str:
    lines = [
        "| target | ms/token c=1 | tok/s c=8 | bound tok/s | c=1 / bound | base agree | "
        "LoRA agree | switch ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in results["targets"].items():
        if "c1_ms" not in row and "agree" not in row:
            lines.append(f"| {label} | {row.get('error', '')} |")
            continue
        c1 = row.get("c1_ms")
        bound = row.get("bound_tok_s")
        share = f"{1000 / c1 / bound:.2f}" if c1 and bound else "-"
        lines.append(
            f"| {label} | {c1 or 0:.1f} | {row.get('c8_tok_s', 0):.0f} "
            f"| {bound or 0:.0f} | {share} "
            f"| {row.get('base_agree', 0):.0%} | {row.get('agree', 0):.0%} "
            f"| {row.get('switch_ms', 0):.1f} |"
        )
    lines.append(f"\nLoRA changes {results['lora_changes']:.0%} of the base model's answers.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
