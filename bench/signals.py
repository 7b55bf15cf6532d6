"""Measure the conversation-signal rules on the hand-labelled corpus.

    .venv/bin/python bench/signals.py --output docs/benchmarks.md

Runs ``reef.learning.follow_ups.read_follow_up`` (the rules ``signals`` uses, with their
defaults) over every (question, answer, follow-up) of tests/data/signals/corpus.jsonl
and prints figures on the whole corpus and on its three parts (``part`` of each case,
see tests/data/signals/assemble.py): ``tuning`` (what the rules were tuned on),
``held out`` (every fourth of the first cases by id, never looked at while tuning) and
``blind`` (written after the rules were frozen, never used to tune them):

- per signal (``correction`` = a complaint, ``accept``, ``rephrase``): precision and
  recall against the labels;
- extraction accuracy: the right value extracted, among follow-ups labelled with one;
- wrong extractions: a value extracted that is not the labelled one (or none was
  labelled), as a share of all follow-ups;
- acceptance recall.

``--misses`` lists the tuning part's cases the rules get wrong (never the held-out
part's); ``--json`` prints the figures as one JSON object (the CI floor test reads it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sections import write_between

from reef.learning.follow_ups import read_follow_up
from reef.learning.value_shapes import normalised

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "signals" / "corpus.jsonl"
SIGNALS = ("correction", "accept", "rephrase")
PARTS = ("tuning", "held out", "blind")
START, END = "<!-- signals:start -->", "<!-- signals:end -->"


def load(path: Path = CORPUS) -> list[dict[str, Any]]:
    """The corpus cases, in id order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def predict(case: dict[str, Any]) -> tuple[str, str | None]:
    """The signal the rules give a case (``none`` when none) and the value extracted."""
    reading = read_follow_up(
        case["follow_up"],
        answer=case["answer"],
        question=case["question"],
        vocabulary=case.get("vocabulary") or (),
    )
    if reading.complaint:
        return "correction", reading.correction
    if reading.accept:
        return "accept", None
    return ("rephrase" if reading.rephrase else "none"), None


def ratio(hits: int, total: int) -> float | None:
    return hits / total if total else None


def figures(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The measured figures of ``cases`` (module doc)."""
    out: dict[str, Any] = {"cases": len(cases)}
    predicted = [predict(case) for case in cases]
    for name in SIGNALS:
        hits = sum(
            1 for c, (s, _) in zip(cases, predicted, strict=True) if s == c["signal"] == name
        )
        said = sum(1 for s, _ in predicted if s == name)
        real = sum(1 for c in cases if c["signal"] == name)
        out[name] = {"precision": ratio(hits, said), "recall": ratio(hits, real), "labelled": real}
    with_value = [(c, v) for c, (_, v) in zip(cases, predicted, strict=True) if c["correction"]]
    right = sum(
        1 for c, v in with_value if v is not None and normalised(v) == normalised(c["correction"])
    )
    wrong = sum(
        1
        for c, (_, v) in zip(cases, predicted, strict=True)
        if v is not None and (not c["correction"] or normalised(v) != normalised(c["correction"]))
    )
    out["with_value"] = len(with_value)
    out["extraction_accuracy"] = ratio(right, len(with_value))
    out["wrong_extractions"] = ratio(wrong, len(cases))
    out["wrong_count"] = wrong
    return out


def misses(cases: list[dict[str, Any]]) -> list[str]:
    """The tuning cases whose signal or value the rules get wrong."""
    lines = []
    for case in cases:
        signal, value = predict(case)
        want = case["correction"]
        value_ok = (value is None and want is None) or (
            value is not None and want is not None and normalised(value) == normalised(want)
        )
        if signal != case["signal"] or not value_ok:
            lines.append(
                f"#{case['id']} [{case['answer']}] {case['follow_up']!r}: "
                f"got {signal}={value!r}, want {case['signal']}={want!r}"
            )
    return lines


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def table(parts: dict[str, dict[str, Any]]) -> str:
    """The markdown table of the figures, a column per corpus part."""
    names = list(parts)
    rows = [
        "| figure | " + " | ".join(f"{n} ({parts[n]['cases']})" for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for signal in SIGNALS:
        for measure in ("precision", "recall"):
            cells = [percent(parts[n][signal][measure]) for n in names]
            rows.append(f"| `{signal}` {measure} | " + " | ".join(cells) + " |")
    cells = [percent(parts[n]["extraction_accuracy"]) for n in names]
    rows.append("| right value, of follow-ups that carry one | " + " | ".join(cells) + " |")
    cells = [f"{percent(parts[n]['wrong_extractions'])} ({parts[n]['wrong_count']})" for n in names]
    rows.append("| wrong value, of all follow-ups | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def section(parts: dict[str, dict[str, Any]], cases: list[dict[str, Any]]) -> str:
    languages = sorted({c["lang"] for c in cases})
    shapes = sorted({c["shape"] for c in cases})
    return "\n".join(
        [
            "## Conversation signals",
            "",
            "The rules that read a user's next message (`reef.learning.follow_ups`, the",
            "defaults of `signals`) on the hand-labelled corpus",
            f"`tests/data/signals/corpus.jsonl`: {len(cases)} (question, answer, follow-up)",
            f"cases, task shapes {', '.join(shapes)}, languages {', '.join(languages)}.",
            "`correction` is a complaint (with or without a value). The rules were tuned",
            "on the tuning part only. The held-out part (every fourth of the first cases by",
            "id) was written with the tuning part before the rules and never looked at while",
            "tuning; the blind part was written after the rules were frozen, in phrasings",
            "chosen without looking at them, so it is the fairest estimate for new traffic.",
            "Three earlier such batches were measured blind, then joined the tuning part",
            "(their first figures: the comments of `tests/data/signals/corpus.txt`).",
            "",
            "```",
            ".venv/bin/python bench/signals.py --output docs/benchmarks.md",
            "```",
            "",
            table(parts),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--misses", action="store_true", help="list the tuning part's cases the rules miss"
    )
    args = parser.parse_args()
    cases = load(args.corpus)
    tuning = [c for c in cases if c["part"] == "tuning"]
    parts = {"all": figures(cases)}
    for name in PARTS:
        parts[name] = figures([c for c in cases if c["part"] == name])
    if args.misses:
        print("\n".join(misses(tuning)))
    if args.json:
        print(json.dumps(parts))
    else:
        print(table(parts))
    if args.output is not None:
        write_between(args.output, START, END, section(parts, cases))
        print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
