"""RL over episodes on a real small model: does ``rl`` with an environment raise the
episode success rate of the order-support agent (examples/order-support)?

    .venv/bin/python bench/episode_rl.py --model smollm2-135m --sft-steps 24 --rl-steps 12 \
        --output docs/benchmarks.md

The start is a LoRA adapter trained by ``sft`` for ``--sft-steps`` on right runs of
the 12 tasks of ``train-tasks.jsonl`` (each turn of a run the toolset scores 1, built
by stepping the environment itself: look up the orders the request names, check the
stock it asks about, open the return the task expects, answer with what the answer
must hold). Then ``rl`` over episodes continues from that adapter on two thirds of the
gate's 18 tasks (``tasks.jsonl``; every task but each third: the **rl tasks**) with
``train_grpo`` and ``environment`` (groups of ``--group-size`` episodes per task,
``--batch-size`` tasks per step, sampled through the training process's own engine);
the other third is **held out**. Start and end are measured the same way on both:
every task greedy once and sampled at temperature 1 ``--eval-repeats`` times, up to
``MAX_TURNS`` replies per episode.

Printed and written (``--output``): success before and after on each split and
decoding, the episodes RL sampled and its model calls, the reward curve, and the CPU
minutes of each phase (this process's user + system time; the engine and the trainer
run in it). Nothing here is a unit test: one seeded run, reported as it came out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine(), load()
from sections import write_between

from reef.core.chat_format import assistant_text
from reef.environments import (
    ChatEndpoint,
    EpisodeError,
    Task,
    build_environment,
    final_answer,
    run_episodes,
)

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "order-support" / "tasks.jsonl"
DEMOS = ROOT / "examples" / "order-support" / "train-tasks.jsonl"
START = "<!-- episode-rl:start -->"
END = "<!-- episode-rl:end -->"
MAX_TURNS = 4  # the right runs take 2 or 3


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def spec_for(tasks_file: Path) -> dict[str, Any]:
    return {
        "type": "python",
        "toolset": "orders",
        "tasks": str(tasks_file),
        "limits": {"max_turns": MAX_TURNS, "episode_timeout_seconds": 600},
    }


def split(tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(held out: every third task, rl tasks: the rest)."""
    return [t for i, t in enumerate(tasks) if i % 3 == 0], [
        t for i, t in enumerate(tasks) if i % 3 != 0
    ]


def write_tasks(tasks: Sequence[Task], path: Path) -> Path:
    rows = [
        {"id": t.id, "messages": list(t.messages), "expected": t.expected, "setup": t.setup}
        for t in tasks
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def right_turns(task: Task) -> list[dict[str, Any]]:
    """The assistant turns of a right run: look up each order the request names, check
    the stock of each item it names, open the expected return, answer."""
    text = " ".join(str(m.get("content") or "") for m in task.messages if m["role"] == "user")
    setup = task.setup or {}
    orders = [o for o in (setup.get("orders") or {}) if o in text]
    wanted = task.expected.get("return_opened")
    if wanted and wanted not in orders:
        orders.append(wanted)
    items = [i for i in (setup.get("stock") or {}) if i in text]
    turns: list[dict[str, Any]] = []
    looked = [("lookup_order", {"order_id": o}) for o in orders]
    looked += [("check_stock", {"item": i}) for i in items]
    if looked:
        turns.append(_calls(looked, "l"))
    if wanted:
        turns.append(_calls([("open_return", {"order_id": wanted, "reason": "customer"})], "r"))
    facts = ", ".join(str(x) for x in task.expected.get("answer_contains") or ())
    turns.append({"role": "assistant", "content": f"Done: {facts}." if facts else "Done."})
    return turns


def _calls(calls: Sequence[tuple[str, dict[str, Any]]], prefix: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"{prefix}{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for n, (name, args) in enumerate(calls)
        ],
    }


async def demonstrations(spec: dict[str, Any], tasks: Sequence[Task]) -> list[Any]:
    """SFT examples of every turn of each task's right run (checked: each run scores 1)."""
    from reef.learning.trainers.spec import SFTExample

    examples = []
    for task in tasks:
        async with build_environment(spec) as env:
            observation = await env.reset(task)
            messages = [dict(m) for m in observation.messages]
            tools = [dict(t) for t in observation.tools]
            for turn in right_turns(task):
                examples.append(
                    SFTExample(messages=list(messages), target=assistant_text(turn), tools=tools)
                )
                messages.append(turn)
                if turn.get("tool_calls"):
                    step = await env.step(turn["tool_calls"])
                    messages.extend(step.messages)
            score = await env.score(task, messages)
        if score.value != 1.0:
            raise SystemExit(f"the right run of {task.id} scores {score.value}: {score.reason}")
    return examples


def success(
    base_url: str, model: str, spec: dict[str, Any], tasks: Sequence[Task], runs: int, temp: float
) -> dict[str, Any]:
    """Each task played ``runs`` times at ``temp`` (seeded): the share scoring 1."""
    jobs = [
        (
            task,
            ChatEndpoint(
                base_url=base_url,
                model=model,
                params={"temperature": temp, "max_tokens": 96, "seed": 1000 + r},
                timeout_seconds=600,
            ),
        )
        for task in tasks
        for r in range(runs)
    ]
    played = run_episodes(spec, jobs, 4)
    scores = [0.0 if isinstance(p, EpisodeError) else p.score.value for p in played]
    calls = [0 if isinstance(p, EpisodeError) else p.tool_calls for p in played]
    answers = [
        None if isinstance(p, EpisodeError) else final_answer(p.messages)[:80] for p in played
    ]
    return {
        "success": sum(s >= 1.0 for s in scores) / len(scores),
        "episodes": len(scores),
        "tool_calls_per_episode": sum(calls) / len(calls),
        "sample_answers": answers[:3],
    }


def measure(args: argparse.Namespace, adapters: dict[str, Path], splits: dict[str, Any]) -> Any:
    """Success of each adapter on each split, greedy and sampled, on one engine."""
    import urllib.request

    from reef.core.digests import tree_digest
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer

    engine = Engine(load_model(args.model, args.home), max_batch=8, threads=args.threads)
    server = BackgroundServer(engine).start()
    results: dict[str, Any] = {}
    try:
        for name, directory in adapters.items():
            body = {
                "lora_name": name,
                "lora_path": str(directory),
                "expected_digest": tree_digest(directory),
            }
            request = urllib.request.Request(  # the loopback engine
                server.base_url + "/load_lora_adapter",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=120).close()  # the loopback engine
            for split_name, (spec, tasks) in splits.items():
                started = cpu_seconds()
                greedy = success(server.base_url, name, spec, tasks, 1, 0.0)
                sampled = success(server.base_url, name, spec, tasks, args.eval_repeats, 1.0)
                results[f"{name}/{split_name}"] = {
                    "greedy": greedy,
                    "sampled": sampled,
                    "cpu_min": (cpu_seconds() - started) / 60,
                }
                print(name, split_name, greedy["success"], sampled["success"], flush=True)
    finally:
        server.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--work", type=Path, default=Path(".reef/bench-episode-rl"))
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--sft-lr", type=float, default=5e-4)
    parser.add_argument(
        "--start-adapter", type=Path, default=None, help="an earlier run's sft adapter (no sft)"
    )
    parser.add_argument("--rl-steps", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--rl-lr", type=float, default=2e-4)
    parser.add_argument("--temperature", type=float, default=1.0, help="rl's sampling")
    parser.add_argument("--beta-kl", type=float, default=0.04)
    parser.add_argument(
        "--loss-type",
        default="sequence_sum",
        choices=["dapo", "bnpo", "grpo", "dr_grpo", "sequence_sum"],
        help="rl's loss_type (default: the one docs/benchmarks.md's figures were measured with)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--eval-repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="measure the sft and rl adapters an earlier run left in --work again "
        "(--eval-repeats sampled runs per task), and print the table; no training",
    )
    args = parser.parse_args(argv)
    if args.remeasure:
        return remeasure(args)

    from reef.learning.trainers import Budget
    from reef.learning.trainers.grpo import train_grpo
    from reef.learning.trainers.lora_sft import train_lora_sft
    from reef.learning.trainers.spec import RLSpec, SFTSpec

    args.work.mkdir(parents=True, exist_ok=True)
    demos = build_environment(spec_for(DEMOS)).tasks()
    held, played = split(build_environment(spec_for(TASKS)).tasks())
    held_spec = spec_for(write_tasks(held, args.work / "held-out.jsonl"))
    played_spec = spec_for(write_tasks(played, args.work / "rl-tasks.jsonl"))
    wall = time.monotonic()

    started = cpu_seconds()
    examples = asyncio.run(demonstrations(spec_for(DEMOS), demos))
    if args.start_adapter is None:
        train_lora_sft(
            SFTSpec(
                model=args.model,
                home=args.home,
                examples=examples,
                output_dir=args.work / "sft",
                budget=Budget(steps=args.sft_steps),
                lr=args.sft_lr,
                batch_size=4,
                max_seq_len=2048,
                threads=args.threads,
            )
        )
    else:  # the start of an earlier run, as it was
        shutil.copytree(args.start_adapter, args.work / "sft", dirs_exist_ok=True)
    sft_cpu = (cpu_seconds() - started) / 60
    print(f"sft: {len(examples)} examples, {sft_cpu:.1f} CPU min")
    splits = {"rl tasks": (played_spec, played), "held out": (held_spec, held)}
    results = measure(args, {"sft": args.work / "sft"}, splits)  # the start, before rl runs

    started = cpu_seconds()
    rl = train_grpo(
        RLSpec(
            model=args.model,
            home=args.home,
            environment=played_spec,
            output_dir=args.work / "rl",
            base_adapter=args.work / "sft",
            group_size=args.group_size,
            batch_size=args.batch_size,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            lr=args.rl_lr,
            beta_kl=args.beta_kl,
            loss_type=args.loss_type,
            budget=Budget(steps=args.rl_steps),
            max_seq_len=2048,
            threads=args.threads,
        ),
        lambda step, steps, loss: print(f"rl: step {step}/{steps} loss {loss:.4f}", flush=True),
    )
    rl_cpu = (cpu_seconds() - started) / 60
    keep = ("reward_curve", "success_curve", "samples", "model_calls", "turns", "bf16")
    print("rl:", {k: rl.metrics[k] for k in keep}, f"{rl_cpu:.1f} CPU min", flush=True)

    results.update(measure(args, {"rl": args.work / "rl"}, splits))
    report = render(args, results, rl.metrics, len(examples), sft_cpu, rl_cpu, wall)
    print(report)
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0


def remeasure(args: argparse.Namespace) -> int:
    """Success of an earlier run's two adapters, measured again with more episodes."""
    held, played = split(build_environment(spec_for(TASKS)).tasks())
    splits = {
        "rl tasks": (spec_for(write_tasks(played, args.work / "rl-tasks.jsonl")), played),
        "held out": (spec_for(write_tasks(held, args.work / "held-out.jsonl")), held),
    }
    results = measure(args, {"sft": args.work / "sft", "rl": args.work / "rl"}, splits)
    print(f"sampled: {args.eval_repeats} runs per task")
    print("| tasks | decoding | episodes | start (sft) | after rl |")
    print("|---|---|---:|---:|---:|")
    for split_name in splits:
        for decoding in ("greedy", "sampled"):
            before = results[f"sft/{split_name}"][decoding]
            after = results[f"rl/{split_name}"][decoding]
            wins = [round(r["success"] * r["episodes"]) for r in (before, after)]
            print(
                f"| {split_name} | {decoding} | {before['episodes']} "
                f"| {before['success']:.0%} ({wins[0]}) | {after['success']:.0%} ({wins[1]}) |"
            )
    return 0


def render(  # the run's figures, as the docs section
    args: argparse.Namespace,
    results: dict[str, Any],
    rl: dict[str, Any],
    examples: int,
    sft_cpu: float,
    rl_cpu: float,
    wall: float,
) -> str:
    info = side.machine()
    rows = []
    for split_name in ("rl tasks", "held out"):
        for decoding in ("greedy", "sampled"):
            before = results[f"sft/{split_name}"][decoding]
            after = results[f"rl/{split_name}"][decoding]
            rows.append(
                f"| {split_name} | {decoding} | {before['episodes']} "
                f"| {before['success']:.0%} | {after['success']:.0%} "
                f"| {before['tool_calls_per_episode']:.1f} "
                f"/ {after['tool_calls_per_episode']:.1f} |"
            )
    evaluation_cpu = sum(r["cpu_min"] for r in results.values())
    curve = ", ".join(f"{x:.2f}" for x in rl["success_curve"])
    return "\n".join(
        [
            "### RL over episodes: the order-support agent (`bench/episode_rl.py`)",
            "",
            "```bash",
            f".venv/bin/python bench/episode_rl.py --model {args.model} --sft-steps "
            f"{args.sft_steps} --sft-lr {args.sft_lr:g} --rl-steps {args.rl_steps} "
            f"--temperature {args.temperature:g} --group-size {args.group_size} "
            f"--batch-size {args.batch_size} --rl-lr {args.rl_lr:g} --beta-kl {args.beta_kl:g} "
            f"--loss-type {args.loss_type} --output docs/benchmarks.md",
            "```",
            "",
            f"- Machine: {info.get('cpu')}, {info.get('cores')} cores; load {side.load()}.",
            f"- Start: `sft` for {args.sft_steps} steps on {examples} turns of right runs of "
            + ("(an earlier run's adapter, reused) " if args.start_adapter else "")
            + "the 12 tasks of train-tasks.jsonl; then `rl` over episodes of 12 of the gate's "
            "18 tasks (the rl tasks; the other 6 held out) for "
            f"{rl['steps']} steps ({args.batch_size} tasks x {args.group_size} episodes per "
            f"step, temperature {args.temperature:g}, lr {args.rl_lr:g}, beta_kl "
            f"{args.beta_kl:g}, loss_type {args.loss_type}; bf16 {rl['bf16']}).",
            f"- RL sampled **{rl['samples']} episodes** ({rl['model_calls']} model calls, "
            f"{rl['turns']} turns trained on, {rl['groups_skipped']} groups without signal); "
            f"success of each step's episodes: {curve}.",
            f"- CPU minutes: sft {sft_cpu:.1f}, rl {rl_cpu:.1f}, measuring "
            f"{evaluation_cpu:.1f}; wall {(time.monotonic() - wall) / 60:.1f} min.",
            "",
            "| tasks | decoding | episodes | success, start (sft) | success, after rl "
            "| tool calls per episode |",
            "|---|---|---:|---:|---:|---:|",
            *rows,
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
