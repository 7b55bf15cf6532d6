"""Bench the ``sft`` trainer against a plain PEFT training loop: tokens per second on
the same data, model, LoRA config, batch size and sequence length, in the same run.

    .venv/bin/python bench/training.py --model smollm2-135m --home .reef --write

The sft figure is the trainer's own ``tokens_per_second`` (its training loop, in the
child process the worker uses; model load and child start are reported apart). The
plain loop is written out below: ``get_peft_model`` + AdamW + ``model(labels=...)``.
Rounds alternate which one runs first. ``--write`` replaces the training section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from reef.learning.trainers import LoraSettings, SFTExample, SFTSpec, run_in_child

START, END = "<!-- training:start -->", "<!-- training:end -->"
COLORS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]
ANIMALS = ["cat", "dog", "owl", "fox", "whale", "horse", "tiger", "crab"]


def dataset(count: int) -> list[SFTExample]:
    """Short labelled questions with one-paragraph answers (fixed, seeded)."""
    rng = random.Random(7)
    examples = []
    for index in range(count):
        color, animal = rng.choice(COLORS), rng.choice(ANIMALS)
        question = f"Describe a {color} {animal} in two sentences. (item {index})"
        answer = (
            f"The {color} {animal} is a rare sight, and people stop to look at it. "
            f"It spends its days {rng.choice(['resting', 'exploring', 'hunting'])} "
            f"near the {rng.choice(['river', 'forest', 'harbour', 'hills'])}."
        )
        examples.append(SFTExample(messages=[{"role": "user", "content": question}], target=answer))
    return examples


def plain_peft_loop(args: argparse.Namespace, examples: list[SFTExample]) -> dict[str, float]:
    """The reference: the simplest correct PEFT LoRA loop, with the engine's loader."""
    import torch
    from peft import LoraConfig, get_peft_model

    from reef.engine.models import load_model

    torch.manual_seed(0)
    started = time.monotonic()
    loaded = load_model(args.model, args.home)
    tokenizer = loaded.tokenizer
    rows = []
    for example in examples:
        prompt: list[int] = tokenizer.apply_chat_template(  # type: ignore[assignment]
            example.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        full: list[int] = tokenizer.apply_chat_template(  # type: ignore[assignment]
            [*example.messages, {"role": "assistant", "content": example.target}],
            tokenize=True,
            return_dict=False,
        )
        full = full[: args.max_seq_len]
        rows.append((full, [-100] * len(prompt) + full[len(prompt) :]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(
            loaded.model,
            LoraConfig(r=args.r, lora_alpha=2 * args.r, target_modules=["q_proj", "v_proj"]),
        )
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4)
    pad = tokenizer.pad_token_id or 0
    load_seconds = time.monotonic() - started
    tokens, loop_started = 0, time.monotonic()
    for step in range(args.steps):
        chunk = [rows[(step * args.batch + i) % len(rows)] for i in range(args.batch)]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in chunk])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in chunk])
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in chunk])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(mask.sum())
    seconds = time.monotonic() - loop_started
    return {"tokens_per_second": tokens / seconds, "load_seconds": load_seconds, "tokens": tokens}


def sft_trainer(args: argparse.Namespace, examples: list[SFTExample]) -> dict[str, float]:
    """The sft trainer, as the learner runs it: in a child process."""
    with tempfile.TemporaryDirectory(prefix="reef-bench-train-") as scratch:
        spec = SFTSpec(
            model=args.model,
            home=args.home,
            examples=examples,
            output_dir=Path(scratch) / "adapter",
            lora=LoraSettings(r=args.r, alpha=2 * args.r, target_modules=["q_proj", "v_proj"]),
            lr=5e-4,
            max_steps=args.steps,
            batch_size=args.batch,
            max_seq_len=args.max_seq_len,
        )
        started = time.monotonic()
        result = run_in_child(spec, work_dir=Path(scratch) / "work")
        wall = time.monotonic() - started
    metrics: dict[str, Any] = result.metrics
    return {
        "tokens_per_second": float(metrics["tokens_per_second"]),
        "load_seconds": wall - float(metrics["seconds"]),
        "tokens": float(metrics["tokens"]),
    }


def report(args: argparse.Namespace, rounds: list[dict[str, dict[str, float]]]) -> str:
    sft = [r["sft"]["tokens_per_second"] for r in rounds]
    plain = [r["plain"]["tokens_per_second"] for r in rounds]
    ratios = [s / p for s, p in zip(sft, plain, strict=True)]
    fmt = " / ".join
    lines = [
        "## Training: `sft` trainer vs a plain PEFT loop",
        "",
        f"Command: `.venv/bin/python bench/training.py --model {args.model} --home {args.home} "
        f"--steps {args.steps} --batch {args.batch} --max-seq-len {args.max_seq_len} "
        f"--rounds {args.rounds} --write`",
        "",
        f"- Machine: {os.cpu_count()} CPU cores, no GPU, {platform.machine()}, "
        f"Python {platform.python_version()}; torch default threads.",
        f"- Data: {args.examples} chat examples (one-paragraph answers), LoRA r={args.r} "
        f"alpha={2 * args.r} on q_proj/v_proj, batch {args.batch}, {args.steps} steps, "
        "loss on assistant tokens only in both.",
        "- tokens/s = non-padding tokens through forward+backward+step, divided by the "
        "training loop's time (model load excluded; reported apart).",
        "",
        "| figure | sft trainer (child process) | plain PEFT loop (in process) | ratio |",
        "|---|---:|---:|---:|",
        f"| tokens/s, per round | {fmt(f'{v:.0f}' for v in sft)} | "
        f"{fmt(f'{v:.0f}' for v in plain)} | {fmt(f'{v:.2f}' for v in ratios)} |",
        f"| tokens/s, median | {statistics.median(sft):.0f} | {statistics.median(plain):.0f} "
        f"| {statistics.median(ratios):.2f} |",
        f"| start + load, s (median) | "
        f"{statistics.median(r['sft']['load_seconds'] for r in rounds):.1f} | "
        f"{statistics.median(r['plain']['load_seconds'] for r in rounds):.1f} | - |",
        "",
        "Target: sft ≥ 0.9x the plain loop. The sft side also pays a child process start "
        "(torch import) and the model load, once per job.",
    ]
    return "\n".join(lines)


def write_section(text: str, path: Path) -> None:
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{START}\n{text}\n{END}\n"
    if START in current and END in current:
        head, rest = current.split(START, 1)
        current = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        current = current.rstrip("\n") + "\n\n" + block
    path.write_text(current, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    examples = dataset(args.examples)
    rounds = []
    for index in range(args.rounds):
        order = ["sft", "plain"] if index % 2 == 0 else ["plain", "sft"]
        figures = {}
        for name in order:
            run = sft_trainer if name == "sft" else plain_peft_loop
            figures[name] = run(args, examples)
            print(f"round {index + 1} {name}: {figures[name]['tokens_per_second']:.0f} tokens/s")
        rounds.append(figures)
    text = report(args, rounds)
    print(text)
    if args.write:
        write_section(text, Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md")


if __name__ == "__main__":
    main()
