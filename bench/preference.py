"""Bench Reef's DPO against TRL's ``DPOTrainer``: the same preference task, start and
budget, side by side in one process; held-out preference accuracy and time per step.

    .venv/bin/python bench/preference.py --model tiny-random --steps 10,20,30 \\
        --output docs/benchmarks.md

The task is the one of tests/learning/test_preference_trainer.py: to every prompt, prefer
the reply ``Squid-7`` over ``Octo-3``; ``--train`` prompts train, ``--held-out`` other
prompts only measure. Both trainers start from the same base with a fresh LoRA of Reef's
default settings (r 8, alpha 16, q_proj and v_proj) and run ``--steps`` optimizer steps
(each budget in turn) of ``--batch`` pairs with the same learning rate (constant, no
warmup), AdamW with weight decay 0.01, no gradient clipping, ``beta`` and seed; Reef's
budget is an exact step count with no validation split. Each tokenizes the pairs its own
way (Reef: the chat template as the engine serves it; TRL: its conversational format).

Both adapters are then loaded the same way (``PeftModel.from_pretrained``) and measured
by the same code: on each held-out prompt, the summed log-probability of each reply. The
figures: preference accuracy (the share of held-out prompts where the trained model
gives ``Squid-7`` the higher log-probability; the base's share is given too), reward
accuracy (where the trained model's margin over the base's grew), the mean margin
gained, and milliseconds per optimizer step (the training loop alone, median over
``--rounds`` rounds, the order alternating).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine()
from sections import write_between

START = "<!-- preference:start -->"
END = "<!-- preference:end -->"
GOOD, BAD = "Squid-7", "Octo-3"
SUBJECTS = ["the sky", "a fruit", "the sea", "a city", "a river", "a song", "a tree", "a bird"]
ASKS = ["Name {}.", "Describe {} in a word.", "What is {}?", "Tell me about {}."]


def prompts(count: int, offset: int) -> list[str]:
    """``count`` distinct prompts (the held-out ones come after the training ones)."""
    every = [ask.format(s) + f" ({n})" for n in range(100) for ask in ASKS for s in SUBJECTS]
    return every[offset : offset + count]


def user(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def run_reef(args: argparse.Namespace, train: list[str], out: Path) -> float:
    """Train with Reef's trainer; ms per step (its training loop)."""
    from reef.learning.trainers import Budget
    from reef.learning.trainers.preference import train_preference
    from reef.learning.trainers.spec import PreferencePair, PreferenceSpec

    spec = PreferenceSpec(
        objective="dpo",
        model=args.model,
        home=args.home,
        pairs=[PreferencePair(messages=user(p), chosen=GOOD, rejected=BAD) for p in train],
        output_dir=out,
        beta=args.beta,
        lr=args.lr,
        budget=Budget(steps=args.steps, validation_fraction=0.0),
        batch_size=args.batch,
        seed=args.seed,
        threads=args.threads,
        device="cpu",
        bf16=False,
    )
    metrics = train_preference(spec).metrics
    assert metrics["steps"] == args.steps, metrics["steps"]
    return float(metrics["seconds"]) / args.steps * 1000


def run_trl(args: argparse.Namespace, train: list[str], out: Path) -> float:
    """TRL's ``DPOTrainer`` as configured by default: the reference's log-probs computed
    at every step."""
    return _trl(args, train, out, precompute=False)


def run_trl_precomputed(args: argparse.Namespace, train: list[str], out: Path) -> float:
    """TRL's ``DPOTrainer`` with ``precompute_ref_log_probs``: the reference's
    log-probs once before training, as Reef computes them."""
    return _trl(args, train, out, precompute=True)


def _trl(args: argparse.Namespace, train: list[str], out: Path, precompute: bool) -> float:
    """Train with TRL's ``DPOTrainer``; ms per step (between its step callbacks)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from reef.engine.models import load_model
    from reef.learning.trainers.spec import LoraSettings

    class Clock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.started = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, args.home)
    lora = LoraSettings()
    dataset = Dataset.from_list(
        [
            {
                "prompt": user(p),
                "chosen": [{"role": "assistant", "content": GOOD}],
                "rejected": [{"role": "assistant", "content": BAD}],
            }
            for p in train
        ]
    )
    config = DPOConfig(
        output_dir=str(out / "trl-run"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        weight_decay=0.01,
        max_grad_norm=0.0,
        beta=args.beta,
        seed=args.seed,
        precompute_ref_log_probs=precompute,
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    clock = Clock()
    trainer = DPOTrainer(
        model=loaded.model,
        args=config,
        train_dataset=dataset,
        processing_class=loaded.tokenizer,
        peft_config=LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        ),
        callbacks=[clock],
    )
    trainer.train()
    trainer.model.save_pretrained(str(out))
    assert len(clock.seconds) == args.steps, len(clock.seconds)
    return sum(clock.seconds) / args.steps * 1000


def measure(args: argparse.Namespace, adapter: Path, held_out: list[str]) -> dict[str, float]:
    """Held-out preference accuracy of ``adapter`` and of the base (see the docstring)."""
    from peft import PeftModel

    from reef.engine.models import load_model
    from reef.learning.trainers.lora_sft import build_features, collate
    from reef.learning.trainers.preference import sequence_logps
    from reef.learning.trainers.spec import SFTExample

    loaded = load_model(args.model, args.home)
    model = PeftModel.from_pretrained(loaded.model, str(adapter)).eval()

    def logps(reply: str) -> tuple[torch.Tensor, torch.Tensor]:
        feats = [
            build_features(loaded.tokenizer, SFTExample(messages=user(p), target=reply), 512)
            for p in held_out
        ]
        batch = collate(feats, 0, torch.device("cpu"))
        with torch.no_grad():
            after = sequence_logps(model, batch)
            with model.disable_adapter():
                before = sequence_logps(model, batch)
        return before, after

    good_before, good_after = logps(GOOD)
    bad_before, bad_after = logps(BAD)
    before, after = good_before - bad_before, good_after - bad_after
    return {
        "accuracy": float((after > 0).float().mean()),
        "base_accuracy": float((before > 0).float().mean()),
        "reward_accuracy": float((after > before).float().mean()),
        "margin_gain": float((after - before).mean()),
        "margin_spread": float((after - before).std()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--train", type=int, default=32, help="training prompts")
    parser.add_argument("--held-out", type=int, default=32, help="held-out prompts")
    parser.add_argument("--steps", default="10,20,30", help="step budgets, comma-separated")
    parser.add_argument("--batch", type=int, default=4, help="pairs per step")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None, help="rewrite its section")
    args = parser.parse_args()
    train, held_out = prompts(args.train, 0), prompts(args.held_out, args.train)
    load = os.getloadavg()[0]
    runs = {
        "Reef DPO": run_reef,
        "TRL DPOTrainer": run_trl,
        "TRL DPOTrainer, reference precomputed": run_trl_precomputed,
    }
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for steps in (int(n) for n in args.steps.split(",")):
            budget = argparse.Namespace(**{**vars(args), "steps": steps})
            ms: dict[str, list[float]] = {name: [] for name in runs}
            found: dict[str, dict[str, float]] = {}
            for round_ in range(args.rounds):
                order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
                for name in order:
                    out = Path(scratch) / f"{steps}-{list(runs).index(name)}-{round_}"
                    ms[name].append(runs[name](budget, train, out))
                    found[name] = measure(args, out, held_out)  # seeded: each round the same
                    print(f"{steps} steps, {name}: {ms[name][-1]:.1f} ms/step, {found[name]}")
            rows += [(steps, name, found[name], statistics.median(ms[name])) for name in runs]
    report = render(args, rows, load)
    print(report)
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0


Row = tuple[int, str, dict[str, float], float]
"""(steps, trainer, held-out figures, median ms per step)."""


def render(args: argparse.Namespace, rows: list[Row], load: float) -> str:
    info = side.machine()
    busy = (
        " (a loaded machine: other work shared the cores)" if load > (os.cpu_count() or 1) else ""
    )
    lines = [
        "## Preference: Reef's DPO vs TRL's `DPOTrainer` (`bench/preference.py`)",
        "",
        f"Command: `.venv/bin/python bench/preference.py --model {args.model} --steps "
        f"{args.steps} --batch {args.batch} --train {args.train} --held-out {args.held_out} "
        f"--rounds {args.rounds} --output docs/benchmarks.md`. {info['cores']} cores, "
        f"{info['cpu']}, Python {info['python']}, {info['date_utc']}, load average "
        f"{load:.1f} at the start{busy}; {args.threads} torch "
        f"thread(s), lr {args.lr} constant, beta {args.beta}, seed {args.seed}, the same "
        "fresh LoRA (r 8, q_proj and v_proj). Prefer `Squid-7` over `Octo-3` to every "
        "prompt; accuracy on held-out prompts (see the script's docstring).",
        "",
        "| steps | trainer | held-out preference accuracy | base's | reward accuracy "
        "| mean margin gained (nats) | ms per step (median) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for steps, name, figures, ms in rows:
        lines.append(
            f"| {steps} | {name} | {figures['accuracy']:.0%} | {figures['base_accuracy']:.0%} | "
            f"{figures['reward_accuracy']:.0%} | {figures['margin_gain']:.2f} "
            f"± {figures['margin_spread']:.2f} | {ms:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
