"""The gate's decision rule under repeated looks: false publishes on A/A, and power.

    .venv/bin/python bench/gate_validity.py --output docs/benchmarks.md

Synthetic paired results through the real decision code: every item has a difficulty
p_i drawn uniformly from [0.2, 0.7]; an arm answers it right ("yes") with chance p_i
(the candidate with p_i + gain), else wrong ("no") — a noisy scorer's view of equal or
better models. The answers are scored by the real ``normalized_exact`` scorer
(``score_answers``) and decided by ``decide_results`` with a ``GateRule`` (defaults,
``min_items`` 10), at up to ``--looks`` looks: after n/looks, 2n/looks, ..., n items.

- sequential (the default method): a candidate is published at the first look that
  passes, rejected at the first that rejects, else undecided after the last;
- bootstrap, looked at again: published at the first look that passes (today's rule
  decided again each round on the grown evidence);
- bootstrap, one look: the rule once, on all n items.

(a) A/A (gain 0): the false-publish rate with its 95% Wilson interval, against
alpha = 2.5% (the one-sided level of the 95% rule). (b) power at true gains of +5, +10
and +20 points. Seeded: the same arguments give the same figures.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_between

from reef.evaluation.config import GateRule
from reef.evaluation.decision import decide_results, score_answers
from reef.evaluation.scorers import ScorerContext, ScorerRegistry
from reef.evaluation.values import Answer, Arm, EvalItem, ItemResult

START = "<!-- gate_validity:start -->"
END = "<!-- gate_validity:end -->"
SUITE = "file:validity"
SCORER = {"type": "normalized_exact"}
METHODS = ("sequential", "bootstrap, looked at again", "bootstrap, one look")


@dataclass
class Tally:
    """Published decisions out of all, and the items the sequential rule used."""

    published: int = 0
    decisions: int = 0
    items_used: int = 0

    def rate(self) -> float:
        return self.published / self.decisions if self.decisions else 0.0


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def simulated_results(n: int, gain: float, rng: random.Random) -> list[ItemResult]:
    """Both arms' answers to ``n`` items, scored by the real scorer, in item order."""
    items = [EvalItem(id=f"i{k:04d}", suite=SUITE, messages=[], reference="yes") for k in range(n)]
    answers = []
    for item in items:
        p = rng.uniform(0.2, 0.7)
        chance: dict[Arm, float] = {"baseline": p, "candidate": p + gain}
        for arm, right in chance.items():
            text = "yes" if rng.random() < right else "no"
            answers.append(Answer(item.key, arm, 0, text, None, None, 0.0))
    return score_answers(items, answers, SCORER, ScorerRegistry(), ScorerContext(), 48)


def looks_of(n: int, looks: int) -> list[int]:
    return sorted({max(1, round(n * k / looks)) for k in range(1, looks + 1)})


def sequential_decision(
    results: list[ItemResult], n: int, looks: int, rule: GateRule
) -> tuple[bool, int]:
    """(published, items used) under the sequential rule, stopping at a final verdict."""
    for m in looks_of(n, looks):
        decision = decide_results(results[: 2 * m], [], rule)
        if decision.verdict != "undecided":
            return decision.passed, m
    return False, n


def bootstrap_decision(
    results: list[ItemResult], n: int, looks: int, rule: GateRule
) -> tuple[bool, bool]:
    """(published at some look, published on one look at n) under the bootstrap rule."""
    again = False
    for m in looks_of(n, looks):
        if decide_results(results[: 2 * m], [], rule).passed:
            again = True
            break
    # Passing at n means passing at some look, so the one-look rule needs no extra call
    # when no look passed.
    once = again and decide_results(results, [], rule).passed
    return again, once


@dataclass(frozen=True)
class Plan:
    """How many decisions each cell gets: ``aa`` (gain 0) and ``power`` for the
    sequential rule; the bootstrap rule (slower: ``samples`` resamples per look) gets the
    first ``bootstrap`` of them."""

    aa: int
    power: int
    bootstrap: int
    looks: int
    samples: int


def simulate(
    sizes: Sequence[int], gains: Sequence[float], plan: Plan
) -> dict[tuple[float, int], dict[str, Tally]]:
    sequential = GateRule(min_items=10)
    bootstrap = GateRule(min_items=10, method="bootstrap", bootstrap_samples=plan.samples)
    table: dict[tuple[float, int], dict[str, Tally]] = {}
    for gain in gains:
        for n in sizes:
            rng = random.Random(f"{gain}:{n}")
            tallies = {method: Tally() for method in METHODS}
            for index in range(plan.aa if gain == 0.0 else plan.power):
                results = simulated_results(n, gain, rng)
                published, used = sequential_decision(results, n, plan.looks, sequential)
                tallies[METHODS[0]].published += published
                tallies[METHODS[0]].decisions += 1
                tallies[METHODS[0]].items_used += used
                if index >= plan.bootstrap:
                    continue
                rule = bootstrap.model_copy(update={"seed": index})
                for method, won in zip(
                    METHODS[1:], bootstrap_decision(results, n, plan.looks, rule), strict=True
                ):
                    tallies[method].published += won
                    tallies[method].decisions += 1
            table[(gain, n)] = tallies
            print(
                f"gain {gain:+.2f} n {n}: "
                + ", ".join(f"{m} {t.rate():.3f}" for m, t in tallies.items()),
                flush=True,
            )
    return table


def report(
    table: dict[tuple[float, int], dict[str, Tally]],
    sizes: Sequence[int],
    gains: Sequence[float],
    args: argparse.Namespace,
    seconds: float,
) -> str:
    alpha = (1 - GateRule().confidence) / 2
    lines = [
        "## Gate validity",
        "",
        "The decision rule looked at again and again (`bench/gate_validity.py`): how often "
        "a candidate equal to the head is published, and how often a better one is.",
        "",
        "Command: `python bench/gate_validity.py "
        f"--decisions {args.decisions} --power-decisions {args.power_decisions} "
        f"--bootstrap-decisions {args.bootstrap_decisions} --looks {args.looks} --sizes "
        f"{','.join(map(str, sizes))} --bootstrap-samples {args.bootstrap_samples}` "
        f"({seconds:.0f} s on this machine). Synthetic paired items (difficulty "
        "U[0.2, 0.7], right/wrong answers scored by `normalized_exact`), decided by "
        f"`decide_results` at up to {args.looks} looks (after n/{args.looks}, ..., n "
        f"items), `min_items` 10, alpha = {alpha:.1%}. Decisions per cell: sequential "
        f"{args.decisions} (A/A) and {args.power_decisions} (power); the bootstrap rule "
        f"the first {args.bootstrap_decisions} of them, with {args.bootstrap_samples} "
        "resamples per look.",
        "",
        "(a) A/A, false publishes (95% Wilson interval):",
        "",
        "| n | " + " | ".join(METHODS) + " |",
        "|---|" + "---|" * len(METHODS),
    ]
    for n in sizes:
        cells = []
        for method in METHODS:
            tally = table[(0.0, n)][method]
            low, high = wilson(tally.published, tally.decisions)
            cells.append(f"{tally.rate():.1%} [{low:.1%}, {high:.1%}]")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(b) Power: share published at a true gain (sequential: mean items used at the decision).",
        "",
        "| gain | n | " + " | ".join(METHODS) + " |",
        "|---|---|" + "---|" * len(METHODS),
    ]
    for gain in gains:
        if gain == 0.0:
            continue
        for n in sizes:
            tallies = table[(gain, n)]
            seq = tallies["sequential"]
            used = seq.items_used / seq.decisions if seq.decisions else 0.0
            cells = [f"{seq.rate():.1%} ({used:.0f} items)"] + [
                f"{tallies[m].rate():.1%}" for m in METHODS[1:]
            ]
            lines.append(f"| +{gain * 100:.0f} pts | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--decisions", type=int, default=1000, help="A/A decisions per n.")
    parser.add_argument(
        "--power-decisions", type=int, default=200, help="Decisions per gain and n."
    )
    parser.add_argument(
        "--bootstrap-decisions",
        type=int,
        default=200,
        help="Of those, how many the (slower) bootstrap rule decides too.",
    )
    parser.add_argument("--looks", type=int, default=5, help="Looks per decision.")
    parser.add_argument("--sizes", default="20,50,100,200,400", help="Items n, comma-separated.")
    parser.add_argument("--gains", default="0,0.05,0.1,0.2", help="True gains (0: A/A).")
    parser.add_argument(
        "--bootstrap-samples", type=int, default=200, help="Resamples of the bootstrap rule."
    )
    parser.add_argument("--output", type=Path, help="Rewrite this section of the file.")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    gains = [float(g) for g in args.gains.split(",")]
    started = time.monotonic()
    plan = Plan(
        args.decisions, args.power_decisions, args.bootstrap_decisions, args.looks,
        args.bootstrap_samples,
    )  # fmt: skip
    table = simulate(sizes, gains, plan)
    text = report(table, sizes, gains, args, time.monotonic() - started)
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
