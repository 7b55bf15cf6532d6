"""The training child: ``python -m reef.learning.trainers sft|preference|rl SPEC.json``.

Started by :func:`reef.learning.trainers.runner.run_in_child`; prints protocol lines on
stdout (see that module) and everything else on stderr. Exits 0 only after printing
its result.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from reef.core.errors import optional_dependency
from reef.core.third_party import filter_third_party_warnings
from reef.engine.process import exit_with_parent
from reef.learning.trainers.runner import protocol_line
from reef.learning.trainers.spec import PreferenceSpec, RLSpec, SFTSpec, TrainResult


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, train, print the result; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m reef.learning.trainers")
    parser.add_argument("method", choices=["sft", "preference", "rl"])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    text = args.spec.read_text(encoding="utf-8")

    def progress(step: int, steps: int, loss: float) -> None:
        print(protocol_line("progress", step=step, steps=steps, loss=loss), flush=True)

    # Torch loads here, in the child only.
    result: TrainResult
    if args.method == "preference":
        with optional_dependency("local", "preference training"):
            from reef.learning.trainers.preference import train_preference

        result = train_preference(PreferenceSpec.model_validate_json(text), progress)
    elif args.method == "rl":
        with optional_dependency("local", "RL training"):
            from reef.learning.trainers.grpo import train_grpo

        result = train_grpo(RLSpec.model_validate_json(text), progress)
    else:
        with optional_dependency("local", "LoRA SFT training"):
            from reef.learning.trainers.lora_sft import train_lora_sft

        result = train_lora_sft(SFTSpec.model_validate_json(text), progress)
    print(protocol_line("result", result=result.model_dump(mode="json")), flush=True)
    return 0


if __name__ == "__main__":
    # Its stderr reaches ``reef serve``'s output: the same notices are hidden as there.
    filter_third_party_warnings()
    sys.exit(main())
