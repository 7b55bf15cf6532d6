"""Bench the ``sft`` trainer against a plain PEFT training loop: tokens per second on
the same data, model, LoRA config, batch size and sequence length, in the same run, with
the trainer in float32 and in bf16 (``bf16: true``; see
``reef.learning.trainers.precision``); and the harness learners' wall time per candidate.

    .venv/bin/python bench/training.py --model smollm2-135m --home .reef --write
    .venv/bin/python bench/training.py --harness-only --write

The sft figure is the trainer's own ``tokens_per_second`` (its training loop, in the
child process the worker uses; model load and child start are reported apart). The
plain loop is written out below: ``get_peft_model`` + AdamW + ``model(labels=...)``.
Rounds alternate which one runs first. ``--write`` replaces the training section of
docs/benchmarks.md.

The harness phase (no torch) times ``learn`` of ``fewshot``, ``instructions`` and
``skills`` on one synthetic batch (scores, textual feedback, corrections), each run in a
fresh artifact store and home (so the instructions Pareto pool starts empty), with a
deterministic local ``reflect`` that returns valid JSON at once: the figures exclude
model latency. ``--harness-only`` skips the sft phase; with ``--write`` it keeps the
sft figures already in docs/benchmarks.md and replaces only the harness part.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from overhead_report import machine

from reef.core import SilentProgress, new_id
from reef.engine.process import cpu_has_amx
from reef.harness import Bundle, Harness, pack_bundle
from reef.learning.base import ExperienceBatch, Learner, LearnerContext, MetricLog, TrainingExample
from reef.learning.learners import (
    FewShotConfig,
    FewShotLearner,
    InstructionsConfig,
    InstructionsLearner,
    SkillsConfig,
    SkillsLearner,
)
from reef.learning.trainers import Budget, LoraSettings, SFTExample, SFTSpec, run_in_child
from reef.releases import ModelComponent, Release, ReleaseManifest, open_artifact_store

START, END = "<!-- training:start -->", "<!-- training:end -->"
HARNESS_HEADING = "## Harness learners: wall time per candidate"
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


def sft_trainer(
    args: argparse.Namespace, examples: list[SFTExample], bf16: bool = False
) -> dict[str, float]:
    """The sft trainer, as the learner runs it: in a child process."""
    with tempfile.TemporaryDirectory(prefix="reef-bench-train-") as scratch:
        spec = SFTSpec(
            model=args.model,
            home=args.home,
            examples=examples,
            output_dir=Path(scratch) / "adapter",
            lora=LoraSettings(r=args.r, alpha=2 * args.r, target_modules=["q_proj", "v_proj"]),
            lr=5e-4,
            budget=Budget(steps=args.steps, schedule="constant", warmup_fraction=0.0),
            batch_size=args.batch,
            max_seq_len=args.max_seq_len,
            bf16=bf16,
        )
        started = time.monotonic()
        result = run_in_child(spec, work_dir=Path(scratch) / "work")
        wall = time.monotonic() - started
    metrics: dict[str, Any] = result.metrics
    return {
        "tokens_per_second": float(metrics["tokens_per_second"]),
        "load_seconds": wall - float(metrics["seconds"]),
        "tokens": float(metrics["tokens"]),
        "final_loss": float(metrics["loss_curve"][-1]),
    }


def sft_bf16(args: argparse.Namespace, examples: list[SFTExample]) -> dict[str, float]:
    """The sft trainer with ``bf16: true``."""
    return sft_trainer(args, examples, bf16=True)


def report(args: argparse.Namespace, rounds: list[dict[str, dict[str, float]]]) -> str:
    sft = [r["sft"]["tokens_per_second"] for r in rounds]
    bf16 = [r["sft-bf16"]["tokens_per_second"] for r in rounds]
    plain = [r["plain"]["tokens_per_second"] for r in rounds]
    ratios = [s / p for s, p in zip(sft, plain, strict=True)]
    speedups = [b / s for b, s in zip(bf16, sft, strict=True)]
    fmt = " / ".join
    median = statistics.median
    lines = [
        "## Training: `sft` trainer vs a plain PEFT loop, float32 and bf16",
        "",
        f"Command: `.venv/bin/python bench/training.py --model {args.model} --home {args.home} "
        f"--steps {args.steps} --batch {args.batch} --max-seq-len {args.max_seq_len} "
        f"--rounds {args.rounds} --write`",
        "",
        f"- Machine: {machine()}; AMX {'yes' if cpu_has_amx() else 'no'}; no GPU; torch "
        "default threads.",
        f"- Data: {args.examples} chat examples (one-paragraph answers), LoRA r={args.r} "
        f"alpha={2 * args.r} on q_proj/v_proj, batch {args.batch}, {args.steps} steps, "
        "loss on assistant tokens only in all three.",
        "- tokens/s = non-padding tokens through forward+backward+step, divided by the "
        "training loop's time (model load excluded; reported apart).",
        "- bf16: `bf16: true` (autocast, the frozen base stored in bfloat16, eager "
        "attention on a CPU; LoRA weights and AdamW state float32).",
        "",
        "| figure | sft float32 (child) | sft bf16 (child) | plain PEFT loop float32 "
        "| sft / plain | bf16 / float32 |",
        "|---|---:|---:|---:|---:|---:|",
        f"| tokens/s, per round | {fmt(f'{v:.0f}' for v in sft)} | "
        f"{fmt(f'{v:.0f}' for v in bf16)} | {fmt(f'{v:.0f}' for v in plain)} | "
        f"{fmt(f'{v:.2f}' for v in ratios)} | {fmt(f'{v:.2f}' for v in speedups)} |",
        f"| tokens/s, median | {median(sft):.0f} | {median(bf16):.0f} | {median(plain):.0f} "
        f"| {median(ratios):.2f} | {median(speedups):.2f} |",
        f"| last step's loss (median) | {median(r['sft']['final_loss'] for r in rounds):.3f} "
        f"| {median(r['sft-bf16']['final_loss'] for r in rounds):.3f} | - | - | - |",
        f"| start + load, s (median) | "
        f"{median(r['sft']['load_seconds'] for r in rounds):.1f} | "
        f"{median(r['sft-bf16']['load_seconds'] for r in rounds):.1f} | "
        f"{median(r['plain']['load_seconds'] for r in rounds):.1f} | - | - |",
        "",
        "Targets: sft float32 >= 0.9x the plain loop; sft bf16 >= 2x float32 (issue 16). "
        "The sft side also pays a child process start (torch import) and the model load, "
        "once per job.",
    ]
    return "\n".join(lines)


TOPICS = [
    ("refund", "mention the 30 day refund window", "Refunds are possible within 30 days."),
    ("password", "give the reset link, not a phone number", "Use the reset link."),
    ("shipping", "say that shipping takes 3 to 5 days", "Shipping takes 3 to 5 working days."),
    ("invoice", "point to the billing page for invoices", "Invoices are on the billing page."),
    ("greeting", "too formal, greet the user warmly", "Hi there! Happy to help."),
]


def harness_batch(count: int) -> list[TrainingExample]:
    """Support-style exchanges: a third corrected, a third low-scored with textual
    feedback, a third high-scored (fixed, seeded)."""
    rng = random.Random(11)
    examples = []
    for index in range(count):
        topic, feedback, correction = TOPICS[index % len(TOPICS)]
        color, animal = rng.choice(COLORS), rng.choice(ANIMALS)
        question = f"Question {index} about {topic}: my {color} {animal} order, what now?"
        kind = index % 3
        record_id = new_id()
        examples.append(
            TrainingExample(
                record_id=record_id,
                scenario="bench",
                session_id=record_id,
                messages=[
                    {"role": "system", "content": "You are a support agent."},
                    {"role": "user", "content": question},
                ],
                response={"role": "assistant", "content": f"Reply {index} on {topic}."},
                score=[0.1, 0.2, 0.9][kind] + rng.random() * 0.1,
                correction=f"{correction} (case {index})" if kind == 0 else None,
                feedback=[f"{feedback} (note {index})"] if kind < 2 else [],
                principals=[f"grader-{index % 4}"],
                release_id=None,
                staleness=0,
                content_hash="sha256:" + record_id,
            )
        )
    return examples


class LocalReflector:
    """A ``Reflector`` answering with ``answer`` (``local_reflect``'s function)."""

    def __init__(self, answer: Callable[[list[dict[str, Any]]], str]) -> None:
        self.answer = answer

    def reflect(self, messages: list[dict[str, Any]]) -> str:
        return self.answer(messages)


def local_reflect(kind: str) -> Callable[[list[dict[str, Any]]], str]:
    """A deterministic stand-in for the reflector model: a valid JSON answer at once."""
    calls = itertools.count()

    def reflect(messages: list[dict[str, Any]]) -> str:
        n = next(calls)
        if kind == "skills":
            return json.dumps(
                {
                    "name": f"support skill {n}",
                    "when_to_use": "When a support question repeats earlier feedback.",
                    "content": f"Follow the feedback given on similar requests (variant {n}).",
                }
            )
        rules = [topic_feedback for _, topic_feedback, _ in TOPICS]
        return json.dumps(
            {
                "system_prompt": f"You are a helpful support agent (variant {n}).",
                "instructions": [r[:1].upper() + r[1:] + "." for r in rules[: 2 + n % 4]],
            }
        )

    return reflect


def time_learner(
    learner: Learner, reflect: Callable[[list[dict[str, Any]]], str], train: list[TrainingExample]
) -> tuple[float, dict[str, Any]]:
    """Seconds for one ``learn`` (one candidate), in a fresh store and home."""
    with tempfile.TemporaryDirectory(prefix="reef-bench-harness-") as scratch:
        root = Path(scratch)
        artifacts = open_artifact_store(root / "artifacts")
        head_harness = Harness(
            schema_version=1, system_prompt="You are a support agent.", instructions=["Be brief."]
        )
        digest = artifacts.put_bytes(pack_bundle(Bundle(head_harness)), "harness")
        head = Release(
            id=new_id(),
            scenario="bench",
            seq=1,
            parent_id=None,
            operation="create",
            manifest=ReleaseManifest(model=ModelComponent(base="m"), harness=digest),
            evidence=None,
            created_by="bench",
            reason=None,
            created_at=datetime.now(UTC),
            candidate_id=None,
            rolled_back_to=None,
        )
        context = LearnerContext(
            scenario="bench",
            head=head,
            batch=ExperienceBatch(train=train, holdout=[]),
            artifacts=artifacts,
            home=root / "home",
            work_dir=root / "work",
            reflector=LocalReflector(reflect),
            progress=SilentProgress(),
            metrics=MetricLog(),
        )
        started = time.perf_counter()
        output = learner.learn(context)
        seconds = time.perf_counter() - started
    if output.harness is None:
        raise RuntimeError(f"{learner.type_name}: no harness candidate")
    return seconds, output.metrics


def harness_phase(args: argparse.Namespace) -> dict[str, tuple[list[float], str]]:
    """Per learner: seconds per run and a note on what the candidate held."""
    train = harness_batch(args.harness_examples)
    learners: list[tuple[Learner, str]] = [
        (FewShotLearner(FewShotConfig()), "fewshot"),
        (InstructionsLearner(InstructionsConfig()), "instructions"),
        (SkillsLearner(SkillsConfig()), "skills"),
    ]
    results: dict[str, tuple[list[float], str]] = {}
    for learner, kind in learners:
        times: list[float] = []
        metrics: dict[str, Any] = {}
        for _ in range(args.harness_runs):
            seconds, metrics = time_learner(learner, local_reflect(kind), train)
            times.append(seconds)
        if kind == "fewshot":
            note = f"{metrics['demos']} demos of {metrics['candidates']} candidates"
        elif kind == "instructions":
            note = (
                f"{metrics['variants_valid']} valid variants (one reflect call each), "
                f"{metrics['failures']} failures shown"
            )
        else:
            note = (
                f"{metrics['new']} skills from {metrics['clusters']} clusters "
                "(one reflect call each)"
            )
        results[kind] = (times, note)
        print(f"{kind}: median {statistics.median(times) * 1000:.1f} ms ({note})")
    return results


def harness_report(args: argparse.Namespace, results: dict[str, tuple[list[float], str]]) -> str:
    lines = [
        HARNESS_HEADING,
        "",
        f"Command: `.venv/bin/python bench/training.py --harness-only "
        f"--harness-examples {args.harness_examples} --harness-runs {args.harness_runs} --write`",
        "",
        f"- Machine: {os.cpu_count()} CPU cores, {platform.machine()}, "
        f"Python {platform.python_version()}; no torch.",
        f"- Batch: {args.harness_examples} synthetic support exchanges over {len(TOPICS)} "
        "topics: a third corrected, a third low-scored with textual feedback, a third "
        "high-scored. Default learner settings (fewshot lexical similarity).",
        "- Time: one `learn` call, i.e. one candidate, from the batch to the bundle stored "
        "by digest; fresh artifact store and home each run (empty Pareto pool).",
        "- `reflect` is a deterministic local function returning valid JSON at once: "
        "**the times exclude model latency**; with a real reflector add its time per call.",
        "",
        "| learner | ms per candidate, per run | median ms | candidate |",
        "|---|---:|---:|---|",
    ]
    for kind, (times, note) in results.items():
        per_run = " / ".join(f"{t * 1000:.1f}" for t in times)
        lines.append(f"| `{kind}` | {per_run} | {statistics.median(times) * 1000:.1f} | {note} |")
    return "\n".join(lines)


def current_section(path: Path) -> str:
    """The training section's text now (between the markers), '' when absent."""
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if START not in current or END not in current:
        return ""
    return current.split(START, 1)[1].split(END, 1)[0].strip("\n")


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
    parser.add_argument("--harness-examples", type=int, default=200)
    parser.add_argument("--harness-runs", type=int, default=5)
    parser.add_argument(
        "--harness-only",
        action="store_true",
        help="skip the sft phase; --write keeps the sft figures already in the docs",
    )
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    docs = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    harness_text = harness_report(args, harness_phase(args))
    if args.harness_only:
        sft_text = current_section(docs).split(HARNESS_HEADING, 1)[0].strip("\n")
        text = f"{sft_text}\n\n{harness_text}" if sft_text else harness_text
        print(harness_text)
        if args.write:
            write_section(text, docs)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    examples = dataset(args.examples)
    rounds = []
    for index in range(args.rounds):
        runs = {"sft": sft_trainer, "sft-bf16": sft_bf16, "plain": plain_peft_loop}
        order = list(runs) if index % 2 == 0 else list(reversed(runs))
        figures = {}
        for name in order:
            figures[name] = runs[name](args, examples)
            print(f"round {index + 1} {name}: {figures[name]['tokens_per_second']:.0f} tokens/s")
        rounds.append(figures)
    text = f"{report(args, rounds)}\n\n{harness_text}"
    print(text)
    if args.write:
        write_section(text, docs)


if __name__ == "__main__":
    main()
