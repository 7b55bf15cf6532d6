"""ONNX Runtime GenAI measured against the eager engine on the packaged SmolLM2, in one
process run: decode speed and time to first token at batch 1, greedy agreement with the
eager engine per weight precision, and its multi-LoRA adapter API with Reef's PEFT
adapters.

    nice -n 19 /path/to/venv/bin/python bench/onnx_genai.py --home .reef \
        --precisions fp32,fp16,int8,int4 --threads 2 --output result.json

It needs an environment of its own (onnxruntime-genai, onnx, onnx-ir, onnxruntime beside
Reef's ``local`` extra; docs/engine.md, "ONNX Runtime GenAI, measured"). Nothing comes
from a model hub: every model is built offline by ``onnxruntime_genai.models.builder``
from the safetensors cache Reef makes of the packaged GGUF, into
``<home>/models/bench-onnx-<precision>``.

What is measured, the same way for the eager engine and every ONNX precision:

- ``c1_ms``: decode time per token at batch 1, greedy, ``--max-tokens`` new tokens with
  end of sequence ignored, after a ``--prompt-tokens`` prompt: (time for ``--max-tokens``
  tokens - time for 1 token) / (``--max-tokens`` - 1), so prefill is left out; median
  over ``--speed-prompts`` different prompts. ``tok_s`` is 1000 / ``c1_ms``.
- ``ttft_ms``: the time of a 1-token request on those prompts (prefill and the first
  token), median; each prompt differs from the others from its first words, so no
  prefix cache answers its prefill.
- ``base_agree``: the share of ``--prompts`` chat prompts (``reef.engine.choice``'s probe
  set) whose greedy answers (up to 32 tokens, ending at the end of the turn) equal the
  eager float32 engine's token for token (``engine_backends.agreement``).
- ``agree`` (LoRA): a rank-8 PEFT LoRA on every projection with seeded random weights
  (``engine_backends.make_adapter``) served by the eager engine and, converted, by ONNX
  Runtime GenAI; the same comparison under the adapter.
- ``switch_ms``: a 1-token request on adapter A right after one on adapter B, less one
  on A after one on A (median of 10 pairs, ``engine_backends.switch_ms``).

LoRA in ONNX Runtime GenAI 0.18: its builder takes a PEFT adapter
(``--extra_options adapter_path=<dir>``) but bakes it into the graph as initializers (one
``lora_A``/``lora_B`` MatMul pair per projection, ``lora_B`` pre-scaled by
``lora_alpha / r``). Its per-request ``Adapters`` API (``Generator.set_active_adapter``)
overrides graph inputs by name from ``.onnx_adapter`` files, so here: the model is built
once with adapter A, its LoRA initializers are made overridable inputs, and every adapter
(A, B and a zero adapter that serves the base model) becomes an ``.onnx_adapter`` by a
builder run of its own whose LoRA initializers are exported (``convert_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_backends as eb  # bench/engine_backends.py: the eager target and the checks
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine()

LORA = ".lora_"  # the builder's LoRA initializers: model.layers.N.<proj>.lora_[AB].MatMul.weight


# --- conversion ----------------------------------------------------------------------


def build(source: Path, target: Path, precision: str, adapter: Path | None = None) -> Path:
    """``onnxruntime_genai.models.builder`` of ``source`` into ``target`` (once), offline;
    with ``adapter`` (a PEFT directory) baked in."""
    if (target / "genai_config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build.", dir=target.parent))
    command = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-m", str(source), "-i", str(source), "-o", str(scratch),
        "-p", precision, "-e", "cpu", "-c", str(scratch / "cache"),
    ]  # fmt: skip
    if adapter is not None:
        command += ["--extra_options", f"adapter_path={adapter}"]
    started = time.perf_counter()
    log = target.parent / f"{target.name}.build.log"
    with log.open("w") as out:
        subprocess.run(
            command, check=True, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
    os.replace(scratch, target)
    print(f"built {target.name} in {time.perf_counter() - started:.1f} s", flush=True)
    return target


def overridable(directory: Path) -> None:
    """Make the LoRA initializers of a builder's model graph inputs too (overridable
    initializers): what the ``Adapters`` API sets per request."""
    import onnx
    from onnx import helper

    path = directory / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    inputs = {i.name for i in model.graph.input}
    added = 0
    for tensor in model.graph.initializer:
        if LORA in tensor.name and tensor.name not in inputs:
            model.graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
            added += 1
    if added:
        onnx.save(model, str(path))


def export_adapter(built: Path, out: Path, zero: bool = False) -> int:
    """The LoRA initializers of a model built with an adapter, as an ``.onnx_adapter``
    (``zero``: the same names, all zeros: the base model). Returns the tensor count."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    model = onnx.load(str(built / "model.onnx"))
    params = {}
    for tensor in model.graph.initializer:
        if LORA in tensor.name:
            array = numpy_helper.to_array(tensor)
            params[tensor.name] = ort.OrtValue.ortvalue_from_numpy(
                np.zeros_like(array) if zero else np.ascontiguousarray(array)
            )
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters(params)
    adapter.export_adapter(str(out))
    return len(params)


# --- ONNX Runtime GenAI --------------------------------------------------------------


class OnnxTarget:
    """An ``onnxruntime_genai.Model``: one ``Generator`` per request, batch 1; adapters
    from ``.onnx_adapter`` files, chosen per request (``None``: ``base`` when one is
    loaded, else the graph as built)."""

    def __init__(self, directory: Path, threads: int | None) -> None:
        import onnxruntime_genai as og

        config_path = directory / "genai_config.json"
        config = json.loads(config_path.read_text())
        options = config["model"]["decoder"]["session_options"]
        if threads:
            options["intra_op_num_threads"] = threads
        else:
            options.pop("intra_op_num_threads", None)
        config_path.write_text(json.dumps(config, indent=4))
        self.og = og
        self.model = og.Model(str(directory))
        self.adapters = og.Adapters(self.model)
        self.names: set[str] = set()
        self.weight_bytes = sum(p.stat().st_size for p in directory.glob("model.onnx*"))
        self.threads = threads or 0

    def close(self) -> None:
        del self.adapters, self.model

    def load(self, name: str, path: Path) -> float:
        started = time.perf_counter()
        self.adapters.load(str(path), name)
        self.names.add(name)
        return time.perf_counter() - started

    def _one(self, ids: list[int], max_tokens: int, adapter: str | None, served: bool) -> list[int]:
        params = self.og.GeneratorParams(self.model)
        length = len(ids) + max_tokens
        params.set_search_options(
            max_length=length, min_length=len(ids) if served else length, do_sample=False
        )
        generator = self.og.Generator(self.model, params)
        adapter = adapter or ("base" if "base" in self.names else None)
        if adapter is not None:
            generator.set_active_adapter(self.adapters, adapter)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)[len(ids) :]]

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        adapter: str | None = None,
        served: bool = False,
    ) -> list[list[int]]:
        return [self._one(ids, max_tokens, adapter, served) for ids in prompts]


# --- measurements --------------------------------------------------------------------


def speed(target: Any, prompts: list[list[int]], tokens: int) -> dict[str, float]:
    """``c1_ms``, ``tok_s`` and ``ttft_ms`` at batch 1 (module docstring); the first
    prompt warms up, every other is new to the target when its first token is timed."""
    target.generate(prompts[:1], 8)  # warm up
    per_token, first = [], []
    for prompt in prompts[1:]:
        one = eb.timed(lambda p=prompt: target.generate([p], 1))
        full = eb.timed(lambda p=prompt: target.generate([p], tokens))
        first.append(one)
        per_token.append((full - one) / (tokens - 1))
    c1 = statistics.median(per_token) * 1000
    return {"c1_ms": c1, "tok_s": 1000 / c1, "ttft_ms": statistics.median(first) * 1000}


def answers(target: Any, chats: list[list[int]], adapter: str | None, eos: frozenset[int]):
    """Greedy answers as served (up to 32 tokens, cut at the end of the turn)."""
    served = not isinstance(target, eb.EagerTarget)
    out = []
    for ids in chats:
        answer = (
            target.generate([ids], 32, adapter, served=True)[0]
            if served
            else target.generate([ids], 32, adapter)[0]
        )
        out.append(eb.until_eos(answer, eos))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--precisions", default="fp32,fp16,int8,int4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--speed-prompts", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--lora-std", type=float, default=0.02)
    parser.add_argument("--skip-lora", action="store_true")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--openvino-ir",
        type=Path,
        default=None,
        help="an OpenVINO IR of the same model (optimum-cli export openvino): measured in "
        "the same run, served as the backend serves it (float32 arithmetic and KV cache)",
    )
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from reef.engine.choice import probe_chats
    from reef.engine.models import DEFAULT_MODEL, load_model, smollm2_cache

    started = time.perf_counter()
    source = smollm2_cache(args.home) if args.model == DEFAULT_MODEL else Path(args.model)
    loaded = load_model(args.model, args.home)
    tokenizer, eos = loaded.tokenizer, loaded.eos_token_ids
    args.eos = eos
    prompts = eb.long_prompts(tokenizer, args.speed_prompts + 1, args.prompt_tokens)
    args.speed_set = prompts
    chats = eb.chat_ids(tokenizer, probe_chats(args.prompts))
    work = Path(tempfile.mkdtemp(prefix="reef-onnx-"))
    lora = {}
    if not args.skip_lora:
        for name, seed in (("a", 1), ("b", 2)):
            model = load_model(args.model, args.home).model
            lora[name] = eb.make_adapter(model, work / f"lora-{name}", seed, args.lora_std)
    del loaded
    results: dict[str, Any] = {
        "machine": side.machine(),
        "command": " ".join(sys.argv),
        "versions": versions(),
        "targets": {},
    }
    print(json.dumps(results["machine"]), flush=True)

    row, reference = eager_row(lora, chats, args)
    report(results, "eager-fp32", row, args)

    for precision in args.precisions.split(","):
        label = f"onnx-{precision}"
        try:
            directory = build(source, args.home / "models" / f"bench-onnx-{precision}", precision)
            target = OnnxTarget(directory, args.threads)
        except Exception as exc:  # a precision the builder or the runtime refuses here
            report(results, label, {"error": repr(exc)}, args)
            continue
        row = {"load_avg": os.getloadavg()[0], "weight_mb": target.weight_bytes / 1e6}
        try:
            row.update(speed(target, prompts, args.max_tokens))
            row["base_agree"] = eb.agreement(answers(target, chats, None, eos), reference["base"])
        except Exception as exc:
            row["error"] = repr(exc)
        finally:
            target.close()
        report(results, label, row, args)

    if args.openvino_ir is not None:
        row = openvino_row(args.openvino_ir, lora, chats, reference, args)
        report(results, "openvino-fp32", row, args)

    if lora:
        report(
            results, "onnx-fp32+lora", lora_row(source, lora, work, chats, reference, args), args
        )
    results["seconds"] = time.perf_counter() - started
    print(table(results))
    print(f"in {results['seconds']:.0f} s, load average now {os.getloadavg()}")
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))
    return 0


def eager_row(
    lora: dict[str, Path], chats: list[list[int]], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, list[list[int]]]]:
    """The eager engine: the baseline speed and the reference answers (base, adapter A)."""
    eager = eb.EagerTarget(args.model, args.home, args.threads)
    row: dict[str, Any] = {"load_avg": os.getloadavg()[0], "weight_mb": eager.weight_bytes / 1e6}
    row.update(speed(eager, args.speed_set, args.max_tokens))
    reference = {"base": answers(eager, chats, None, args.eos)}
    row["base_agree"] = 1.0
    if lora:
        for name, path in lora.items():
            eager.load_adapter(name, path)
        reference["a"] = answers(eager, chats, "a", args.eos)
        row["agree"] = 1.0
        row["switch_ms"] = eb.switch_ms(eager, chats[0], "a", "b")
        row["lora_changes"] = 1 - eb.agreement(reference["a"], reference["base"])
    eager.close()
    return row, reference


def lora_row(
    source: Path,
    lora: dict[str, Path],
    work: Path,
    chats: list[list[int]],
    reference: dict[str, list[list[int]]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The fp32 model built with adapter A, its LoRA made overridable, adapters A, B and a
    zero one loaded through the ``Adapters`` API and chosen per request."""
    eos = args.eos
    row: dict[str, Any] = {"load_avg": os.getloadavg()[0]}
    try:
        served = build(source, args.home / "models" / "bench-onnx-fp32-lora", "fp32", lora["a"])
        overridable(served)
        files = {"a": work / "a.onnx_adapter", "b": work / "b.onnx_adapter"}
        export_adapter(served, files["a"])
        started = time.perf_counter()  # what converting one more adapter costs
        export_adapter(build(source, work / "built-b", "fp32", lora["b"]), files["b"])
        row["convert_s"] = time.perf_counter() - started
        files["base"] = work / "base.onnx_adapter"
        export_adapter(served, files["base"], zero=True)
        target = OnnxTarget(served, args.threads)
        row["weight_mb"] = target.weight_bytes / 1e6
        row["adapter_load_ms"] = 1000 * max(target.load(n, f) for n, f in files.items())
        try:
            row.update(speed(target, args.speed_set, args.max_tokens))
            row["base_agree"] = eb.agreement(answers(target, chats, None, eos), reference["base"])
            row["agree"] = eb.agreement(answers(target, chats, "a", eos), reference["a"])
            row["switch_ms"] = eb.switch_ms(target, chats[0], "a", "b")
        finally:
            target.close()
    except Exception as exc:
        row["error"] = repr(exc)
    return row


def openvino_row(
    directory: Path,
    lora: dict[str, Path],
    chats: list[list[int]],
    reference: dict[str, list[list[int]]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """OpenVINO GenAI's continuous batching pipeline on ``directory``, batch 1, adapters
    registered at construction and chosen per call (``engine_backends.OpenVINOTarget``)."""
    row: dict[str, Any] = {"load_avg": os.getloadavg()[0]}
    try:
        target = eb.OpenVINOTarget(directory, args.threads, lora, f32=True)
    except Exception as exc:  # no openvino-genai here
        row["error"] = repr(exc)
        return row
    row["weight_mb"] = target.weight_bytes / 1e6
    try:
        row.update(speed(target, args.speed_set, args.max_tokens))
        row["base_agree"] = eb.agreement(answers(target, chats, None, args.eos), reference["base"])
        if lora:
            row["agree"] = eb.agreement(answers(target, chats, "a", args.eos), reference["a"])
            row["switch_ms"] = eb.switch_ms(target, chats[0], "a", "b")
    except Exception as exc:
        row["error"] = repr(exc)
    finally:
        target.close()
    return row


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    out = {}
    for package in (
        "onnxruntime-genai", "onnxruntime", "onnx", "openvino-genai", "torch", "transformers",
        "peft",
    ):  # fmt: skip
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "-"
    return out


def report(results: dict[str, Any], label: str, row: dict[str, Any], args: argparse.Namespace):
    results["targets"][label] = row
    print(label, json.dumps(row), flush=True)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))


def pct(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.0%}" if key in row else "-"


def table(results: dict[str, Any]) -> str:
    eager = results["targets"].get("eager-fp32", {})
    lines = [
        f"CPU: {results['machine']['cpu']} ({results['machine']['cores']} cores, "
        f"{results['machine']['vector']}); {json.dumps(results['versions'])}",
        "",
        "| target | weights MB | ms/token c=1 | tok/s c=1 | x eager | TTFT ms | x eager TTFT "
        "| base agree | LoRA agree | switch ms | load avg |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in results["targets"].items():
        if "c1_ms" not in row:
            lines.append(f"| {label} | {row.get('error', '')[:200]} |")
            continue

        switch = f"{row['switch_ms']:.1f}" if "switch_ms" in row else "-"

        lines.append(
            f"| {label} | {row.get('weight_mb', 0):.0f} | {row['c1_ms']:.1f} "
            f"| {row['tok_s']:.1f} | {row['tok_s'] / eager.get('tok_s', row['tok_s']):.2f} "
            f"| {row['ttft_ms']:.0f} | {row['ttft_ms'] / eager.get('ttft_ms', row['ttft_ms']):.2f} "
            f"| {pct(row, 'base_agree')} | {pct(row, 'agree')} "
            f"| {switch} | {row['load_avg']:.1f} |"
        )
    if "lora_changes" in eager:
        lines.append(f"\nThe LoRA changes {eager['lora_changes']:.0%} of the base model's answers.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
