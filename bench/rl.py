"""Calibrate RL: Reef's GRPO and TRL's ``GRPOTrainer`` side by side on the order-support
agent task (examples/order-support), from the same sft start, under the same budget.

    .venv/bin/python bench/rl.py --model smollm2-135m --output docs/benchmarks.md

The start and the tasks are ``bench/episode_rl.py``'s: a LoRA adapter trained by ``sft``
for ``--sft-steps`` on right runs of ``train-tasks.jsonl`` (or ``--start-adapter``), then
RL on two thirds of the gate's 18 tasks, the other third held out. Both trainers continue
that adapter for ``--rl-steps`` steps of ``--batch-size`` tasks x ``--group-size``
episodes, at the same learning rate, temperature and KL weight, each with up to
``MAX_TURNS`` replies per episode and ``--max-new-tokens`` tokens per reply:

- **Reef**: ``train_grpo`` with the ``python`` environment and the ``orders`` toolset,
  episodes sampled through the trainer's own engine. ``--loss-type`` is passed to
  ``RLSpec`` when this checkout's spec has the field; when it rejects it, the run says so
  and trains Reef's one loss.
- **TRL**: ``GRPOTrainer`` multi-turn, through its ``environment_factory``: one shop per
  rollout, whose methods are the ``orders`` toolset's tools over that rollout's state;
  the reward is the toolset's own ``score`` of the finished conversation (no scorer of
  the bench's). SmolLM2's template takes no tools, so the tokenizer gets TRL's Qwen2.5
  template (same ChatML tokens, the Hermes ``<tool_call>`` format Reef's engine uses)
  with the system line and the tool lines exactly as Reef renders them: the prompt TRL
  samples from is byte for byte the one Reef's engine serves (checked at start).

Both results are measured the same way, through Reef's engine: each held-out task greedy
once and sampled at temperature 1 ``--eval-repeats`` times (``--measure-rl-tasks`` adds
the RL tasks). Printed and written (``--output``): held-out success of the start and of
each trainer, seconds and CPU seconds per step, CPU minutes in all (this process and its
children; both trainers run in this one).

The defaults fit about 15 CPU minutes (TRL's steps cost most: about 166 CPU s each on
two cores, Reef's 22); they check the two sides, they do not calibrate. A start that
wins about half its episodes and more steps do: ``--sft-steps 100 --rl-steps 12``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine(), load()
import episode_rl as erl  # the start, the split, the measuring
from sections import write_between

from reef.environments import Task, build_environment

START = "<!-- rl-calibration:start -->"
END = "<!-- rl-calibration:end -->"
TRL_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")


def cpu_seconds() -> float:
    """This process's and its waited-for children's user + system time."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def sft_start(args: argparse.Namespace) -> dict[str, Any]:
    """The shared start: ``--start-adapter`` copied, or ``sft`` as in episode_rl.py."""
    target = args.work / "sft"
    started = cpu_seconds()
    if args.start_adapter is not None:
        shutil.copytree(args.start_adapter, target, dirs_exist_ok=True)
        return {"examples": None, "cpu_min": 0.0}
    from reef.learning.trainers import Budget
    from reef.learning.trainers.lora_sft import train_lora_sft
    from reef.learning.trainers.spec import SFTSpec

    examples = asyncio.run(erl.demonstrations(erl.spec_for(erl.DEMOS), demo_tasks()))
    train_lora_sft(
        SFTSpec(
            model=args.model,
            home=args.home,
            examples=examples,
            output_dir=target,
            budget=Budget(steps=args.sft_steps),
            lr=args.sft_lr,
            batch_size=4,
            max_seq_len=2048,
            threads=args.threads,
        )
    )
    return {"examples": len(examples), "cpu_min": (cpu_seconds() - started) / 60}


def demo_tasks() -> list[Task]:
    return build_environment(erl.spec_for(erl.DEMOS)).tasks()


def reef_spec(args: argparse.Namespace, environment: dict[str, Any]) -> tuple[Any, str]:
    """Reef's RLSpec for this run, and the loss it trains: ``--loss-type`` when the
    spec takes the field, else its one loss (said so)."""
    from pydantic import ValidationError

    from reef.learning.trainers import Budget
    from reef.learning.trainers.spec import RLSpec

    fields: dict[str, Any] = {
        "model": args.model,
        "home": args.home,
        "environment": environment,
        "output_dir": args.work / "reef",
        "base_adapter": args.work / "sft",
        "group_size": args.group_size,
        "batch_size": args.batch_size,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "lr": args.lr,
        "beta_kl": args.beta_kl,
        "budget": Budget(steps=args.rl_steps),
        "max_seq_len": 2048,
        "threads": args.threads,
        "seed": args.seed,
    }
    if args.loss_type is None:
        field = RLSpec.model_fields.get("loss_type")
        return RLSpec(**fields), "sequence sum" if field is None else str(field.default)
    try:
        return RLSpec(**fields, loss_type=args.loss_type), args.loss_type
    except ValidationError as error:
        if "loss_type" in RLSpec.model_fields:
            raise SystemExit(f"--loss-type {args.loss_type!r}: {error}") from error
        print(
            f"note: this checkout's RLSpec has no loss_type field, so --loss-type "
            f"{args.loss_type} is not Reef's to take: Reef trains its one loss "
            "(log-probs summed per completion)",
            flush=True,
        )
        return RLSpec(**fields), "sequence sum (no loss_type field)"


def reef_run(args: argparse.Namespace, environment: dict[str, Any]) -> dict[str, Any]:
    from reef.learning.trainers.grpo import train_grpo

    spec, loss = reef_spec(args, environment)
    started, wall = cpu_seconds(), time.monotonic()
    result = train_grpo(
        spec,
        lambda step, steps, value: print(f"reef: step {step}/{steps} loss {value:.4f}", flush=True),
    )
    metrics = result.metrics
    steps = int(metrics["steps"]) or 1
    cpu = cpu_seconds() - started
    return {
        "loss": loss,
        "steps": metrics["steps"],
        "cpu_min": cpu / 60,
        "wall_min": (time.monotonic() - wall) / 60,
        "step_seconds": float(metrics["seconds"]) / steps,
        "step_cpu_seconds": cpu / steps,
        "success_curve": list(metrics.get("success_curve") or ()),
        "episodes": metrics.get("samples"),
    }


class Shop:
    """One rollout's order-support shop for TRL's ``environment_factory``: the ``orders``
    toolset's tools over this rollout's own state (the toolset keeps module state, so each
    call binds this shop's state first; TRL calls sync tools one at a time)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.task: dict[str, Any] = {}

    def reset(self, **row: Any) -> None:
        from reef.environments.examples import orders

        self.task = json.loads(row["task"])
        self.state = {}
        orders.use_state(self.state)  # a fresh one: reset fills the bound dict in place
        orders.reset(self.task)

    def _call(self, name: str, **arguments: Any) -> str:
        from reef.environments.examples import orders

        orders.use_state(self.state)
        return json.dumps(getattr(orders, name)(**arguments), default=str)

    def _score(self, messages: list[dict[str, Any]]) -> float:
        from reef.environments.examples import orders

        orders.use_state(self.state)
        return orders.score(self.task, messages)[0]

    def lookup_order(self, order_id: str) -> str:
        """Look up an order by its id: its status, item and days since delivery.

        Args:
            order_id: the order's id
        """
        return self._call("lookup_order", order_id=order_id)

    def check_stock(self, item: str) -> str:
        """How many of an item are in stock.

        Args:
            item: the item
        """
        return self._call("check_stock", item=item)

    def open_return(self, order_id: str, reason: str) -> str:
        """Open a return for a delivered order within the return window.

        Args:
            order_id: the order's id
            reason: why
        """
        return self._call("open_return", order_id=order_id, reason=reason)


def episode_reward(completions: list[Any], environments: list[Shop], **_: Any) -> list[float]:
    """The toolset's score of each finished rollout (the same check Reef's episodes get)."""
    return [shop._score(list(done)) for done, shop in zip(completions, environments, strict=True)]


def served_prompt(tokenizer: Any, task: Task, tools: list[dict[str, Any]]) -> str:
    """What Reef's engine renders for ``task``'s first turn with ``tools``."""
    from reef.core.chat_format import render_tools

    chat = render_tools(list(task.messages), tools, template_takes_tools=False)
    text: str = tokenizer.apply_chat_template(
        chat.messages, tokenize=False, add_generation_prompt=True
    )
    return text


def trl_template(tools: list[dict[str, Any]]) -> str:
    """TRL's Qwen2.5 template with Reef's system line and tool lines: no default system
    text, and the tools written as Reef's engine writes them (whatever TRL passes)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from reef.core.chat_format import tool_prompt

    lines = tool_prompt(tools).split("<tools>\n", 1)[1].split("</tools>", 1)[0]
    head = """    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools"""
    loop = """    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
"""
    if head not in qwen2_5_chat_template or loop not in qwen2_5_chat_template:
        raise SystemExit("TRL's Qwen2.5 template changed: bench/rl.py cannot adapt it")
    own_head = """    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools"""
    own_loop = "    {{- " + json.dumps("\n" + lines.rstrip("\n")) + " }}\n"
    return qwen2_5_chat_template.replace(head, own_head).replace(loop, own_loop)


def trl_tokenizer(tokenizer: Any, tools: list[dict[str, Any]]) -> Any:
    """SmolLM2's tokenizer with the template above and TRL's response parser for it."""
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    tokenizer.chat_template = qwen2_5_chat_template
    add_response_schema(tokenizer)  # the Qwen2.5 parser: <tool_call> JSON blocks
    tokenizer.chat_template = trl_template(tools)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def trl_loss(args: argparse.Namespace) -> str:
    if args.trl_loss_type is not None:
        return str(args.trl_loss_type)
    return args.loss_type if args.loss_type in TRL_LOSSES else "grpo"


def trl_run(
    args: argparse.Namespace, tasks: list[Task], cpu_minutes: float | None = None
) -> dict[str, Any]:
    """TRL's GRPOTrainer over the same tasks, from the same adapter, for the same steps;
    with ``cpu_minutes``, stopped at the end of the step that reaches that CPU time."""
    import datasets
    import torch
    from peft import PeftModel
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reef.engine.models import load_model

    tools = asyncio.run(first_tools(tasks[0]))
    loaded = load_model(args.model, args.home)
    served = served_prompt(loaded.tokenizer, tasks[0], tools)
    tokenizer = trl_tokenizer(loaded.tokenizer, tools)
    ours = tokenizer.apply_chat_template(
        list(tasks[0].messages), tools=tools, tokenize=False, add_generation_prompt=True
    )
    if ours != served:
        raise SystemExit(f"TRL's prompt differs from Reef's:\n{ours!r}\n{served!r}")
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = PeftModel.from_pretrained(loaded.model, args.work / "sft", is_trainable=True)
    rows = [
        {
            "prompt": list(task.messages),
            "task": json.dumps({"expected": task.expected, "setup": task.setup}),
        }
        for task in tasks
    ]
    config = GRPOConfig(
        output_dir=str(args.work / "trl-run"),
        max_steps=args.rl_steps,
        per_device_train_batch_size=args.batch_size * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=args.beta_kl,
        temperature=args.temperature,
        max_completion_length=args.max_new_tokens * erl.MAX_TURNS,
        max_tool_calling_iterations=erl.MAX_TURNS - 1,
        loss_type=trl_loss(args),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # Reef's trainers: off on CPU
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=args.seed,
        dataloader_num_workers=0,
    )
    clock = StepClock(TrainerCallback, None if cpu_minutes is None else cpu_minutes * 60)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[episode_reward],
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=Shop,
        callbacks=[clock.callback],
    )
    started, wall = cpu_seconds(), time.monotonic()
    trainer.train()
    cpu = cpu_seconds() - started
    trainer.model.save_pretrained(str(args.work / "trl"))
    steps = int(trainer.state.global_step) or 1
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    return {
        "loss": trl_loss(args),
        "steps": trainer.state.global_step,
        "cpu_min": cpu / 60,
        "wall_min": (time.monotonic() - wall) / 60,
        "step_seconds": sum(clock.seconds) / steps,
        "step_cpu_seconds": cpu / steps,
        "success_curve": rewards,
        "episodes": steps * args.batch_size * args.group_size,
        "cpu_budget_min": cpu_minutes,
        "stopped_by_budget": clock.stopped_by_budget,
    }


class StepClock:
    """Wall seconds of each TRL step, through a TrainerCallback; with ``cpu_budget``
    (CPU seconds), training stops at the end of the first step that reaches it, so TRL
    runs the CPU minutes Reef's run took (``--trl-cpu-minutes``)."""

    def __init__(self, base: type, cpu_budget: float | None = None) -> None:
        self.seconds: list[float] = []
        self._began = 0.0
        self._started = cpu_seconds()
        self.stopped_by_budget = False
        clock = self

        class Callback(base):  # type: ignore[misc, valid-type]
            def on_step_begin(self, *_: Any, **__: Any) -> None:
                clock._began = time.monotonic()

            def on_step_end(self, _args: Any, _state: Any, control: Any, **__: Any) -> None:
                clock.seconds.append(time.monotonic() - clock._began)
                used = cpu_seconds() - clock._started
                print(
                    f"trl: step {len(clock.seconds)} {clock.seconds[-1]:.1f} s, "
                    f"{used / 60:.1f} CPU min so far",
                    flush=True,
                )
                if cpu_budget is not None and used >= cpu_budget:
                    clock.stopped_by_budget = True
                    control.should_training_stop = True

        self.callback = Callback()


async def first_tools(task: Task) -> list[dict[str, Any]]:
    """The tools the ``python`` environment offers (as OpenAI tool dicts)."""
    async with build_environment(erl.spec_for(erl.TASKS)) as env:
        observation = await env.reset(task)
        return [dict(tool) for tool in observation.tools]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--work", type=Path, default=Path(".reef/bench-rl"))
    parser.add_argument("--sft-steps", type=int, default=16)
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument(
        "--start-adapter", type=Path, default=None, help="an earlier run's sft adapter (no sft)"
    )
    parser.add_argument("--rl-steps", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--beta-kl",
        type=float,
        default=0.0,
        help="KL weight, both trainers (0: TRL's default; with more, TRL's reference is "
        "the base with the adapter off, Reef's the sft start)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=96, help="per reply")
    parser.add_argument(
        "--loss-type",
        default=None,
        help="Reef's GRPO loss (passed to RLSpec when it has the field); TRL's too when "
        f"TRL has it ({', '.join(TRL_LOSSES)}), else TRL's 'grpo'",
    )
    parser.add_argument("--trl-loss-type", default=None, help="TRL's loss_type (overrides)")
    parser.add_argument("--eval-repeats", type=int, default=1)
    parser.add_argument("--measure-rl-tasks", action="store_true")
    parser.add_argument("--only", choices=("reef", "trl"), default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--trl-cpu-minutes",
        default=None,
        help="stop TRL at the end of the step that reaches this many CPU minutes; 'reef': "
        "the CPU minutes Reef's run took in this process (equal CPU minutes)",
    )
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    wall = time.monotonic()
    held, played = erl.split(build_environment(erl.spec_for(erl.TASKS)).tasks())
    held_spec = erl.spec_for(erl.write_tasks(held, args.work / "held-out.jsonl"))
    played_spec = erl.spec_for(erl.write_tasks(played, args.work / "rl-tasks.jsonl"))
    start = sft_start(args)
    print(f"sft start: {start}", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    if args.only in (None, "reef"):
        runs["reef"] = reef_run(args, played_spec)
        print("reef:", runs["reef"], flush=True)
    if args.only in (None, "trl"):
        budget = args.trl_cpu_minutes
        if budget == "reef":
            if "reef" not in runs:
                raise SystemExit("--trl-cpu-minutes reef needs Reef's run in the same process")
            budget = runs["reef"]["cpu_min"]
        runs["trl"] = trl_run(args, played, None if budget is None else float(budget))
        print("trl:", runs["trl"], flush=True)
    splits = {"held out": (held_spec, held)}
    if args.measure_rl_tasks:
        splits["rl tasks"] = (played_spec, played)
    started = cpu_seconds()
    adapters = {"sft": args.work / "sft", **{name: args.work / name for name in runs}}
    measured = erl.measure(args, adapters, splits)
    measure_cpu = (cpu_seconds() - started) / 60
    report = render(args, start, runs, measured, list(splits), measure_cpu, wall)
    print(report)
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0


def render(
    args: argparse.Namespace,
    start: dict[str, Any],
    runs: dict[str, dict[str, Any]],
    measured: dict[str, Any],
    splits: list[str],
    measure_cpu: float,
    wall: float,
) -> str:
    info = side.machine()
    command = (
        f".venv/bin/python bench/rl.py --model {args.model} --sft-steps {args.sft_steps} "
        f"--rl-steps {args.rl_steps} --group-size {args.group_size} --batch-size "
        f"{args.batch_size} --lr {args.lr:g} --beta-kl {args.beta_kl:g} --eval-repeats "
        f"{args.eval_repeats}"
        + (f" --loss-type {args.loss_type}" if args.loss_type else "")
        + (" --measure-rl-tasks" if args.measure_rl_tasks else "")
        + (f" --trl-cpu-minutes {args.trl_cpu_minutes}" if args.trl_cpu_minutes else "")
        + " --output docs/benchmarks.md"
    )
    rows = []
    for name in ("sft", *runs):
        run = runs.get(name)
        label = "start (sft)" if run is None else f"{name} GRPO, loss {run['loss']}"
        cells = [label]
        for split_name in splits:
            for decoding in ("greedy", "sampled"):
                got = measured[f"{name}/{split_name}"][decoding]
                wins = round(got["success"] * got["episodes"])
                cells.append(f"{got['success']:.0%} ({wins}/{got['episodes']})")
        if run is None:
            cells += ["-", "-", "-", f"{start['cpu_min']:.1f}"]
        else:
            cells += [
                str(run["steps"]),
                f"{run['step_seconds']:.1f}",
                f"{run['step_cpu_seconds']:.1f}",
                f"{run['cpu_min']:.1f}",
            ]
        rows.append("| " + " | ".join(cells) + " |")
    heads = [f"{s}, {d}" for s in splits for d in ("greedy", "sampled")]
    curves = "; ".join(
        f"{name}: " + ", ".join(f"{x:.2f}" for x in run["success_curve"])
        for name, run in runs.items()
    )
    return "\n".join(
        [
            "```bash",
            command,
            "```",
            "",
            f"- Machine: {info.get('cpu')}, {info.get('cores')} cores; load {side.load()} "
            "at the end.",
            f"- Start: `sft` for {args.sft_steps} steps (lr {args.sft_lr:g})"
            + (" (an earlier run's adapter, reused)" if args.start_adapter else "")
            + f"; then each trainer {args.rl_steps} steps of {args.batch_size} tasks x "
            f"{args.group_size} episodes (lr {args.lr:g}, temperature {args.temperature:g}, "
            f"beta {args.beta_kl:g}, up to {erl.MAX_TURNS} replies of {args.max_new_tokens} "
            "tokens) on 12 of the gate's 18 tasks; 6 held out.",
            f"- Reward of each step's episodes: {curves}.",
            *budget_line(args, runs),
            f"- Measuring (greedy once, sampled {args.eval_repeats}x per task): "
            f"{measure_cpu:.1f} CPU min; wall {(time.monotonic() - wall) / 60:.1f} min in all.",
            "",
            "| policy | " + " | ".join(heads) + " | steps | s per step | CPU s per step "
            "| CPU min |",
            "|---|" + "---:|" * (len(heads) + 4),
            *rows,
        ]
    )


def budget_line(args: argparse.Namespace, runs: dict[str, dict[str, Any]]) -> list[str]:
    """The line saying TRL ran under a CPU budget (``--trl-cpu-minutes``), if it did."""
    trl = runs.get("trl")
    if trl is None or trl.get("cpu_budget_min") is None:
        return []
    how = "stopped by it" if trl["stopped_by_budget"] else "finished its steps within it"
    return [
        f"- TRL ran to a budget of {trl['cpu_budget_min']:.1f} CPU min "
        f"({'Reef' if args.trl_cpu_minutes == 'reef' else 'given'}): {trl['steps']} of "
        f"{args.rl_steps} steps, {how} (a step ends past the budget)."
    ]


if __name__ == "__main__":
    raise SystemExit(main())
