# python examples/order-support/play.py --base-url http://127.0.0.1:8080/v1   (a reef gateway)
"""Play the order-support tasks once each, the way the recipe's gate plays them: the
environment of recipe.yaml's ``gate.episodes`` (the ``python`` environment's ``orders``
toolset on tasks.jsonl, its turn limits), against any OpenAI-compatible endpoint. Print
each task's outcome and how many the agent finished. Through the Reef gateway every
episode is one recorded session with purpose ``eval`` (never trained on)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from reef.environments import ChatEndpoint, build_environment, run_episode
from reef.learning import load_recipe

RECIPE = Path(__file__).resolve().parent / "recipe.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    """Play every task; 0 when each scored 1, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--scenario", default="orders", help="the gateway's scenario")
    parser.add_argument("--model", default=None, help="default: reef/<scenario>")
    parser.add_argument("--api-key", default=os.environ.get("REEF_API_KEY"))
    args = parser.parse_args(argv)

    gate = load_recipe(RECIPE).gate
    assert gate.episodes is not None
    environment = build_environment(gate.episodes.spec())
    endpoint = ChatEndpoint(
        base_url=args.base_url,
        model=args.model or f"reef/{args.scenario}",
        api_key=args.api_key,
        headers={"x-reef-scenario": args.scenario, "x-reef-purpose": "eval"},
        params={"max_tokens": gate.max_tokens, "temperature": gate.temperature},
    )
    tasks = environment.tasks()
    finished = 0
    for task in tasks:
        result = run_episode(environment, task, endpoint)
        finished += result.score.value == 1.0
        print(
            f"{result.score.value:.0f}  {task.id:<30} {result.stop:<9} "
            f"{result.turns} turns, {result.tool_calls} tool calls: {result.score.reason}"
        )
    print(f"{finished}/{len(tasks)} tasks done right")
    return 0 if finished == len(tasks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
