"""Turn the hand-written corpus.txt into corpus.jsonl and check it.

    python tests/data/signals/assemble.py

Each case becomes one JSON line: ``id`` (its order in the file), ``shape``, ``lang``,
``question``, ``answer``, ``vocabulary``, ``follow_up``, ``signal`` (``correction``,
``accept``, ``rephrase`` or ``none``), ``correction`` (the value, or null) and
``part``: ``held out`` (every fourth case by id, never looked at while tuning the
rules), ``blind`` (groups marked ``blind``: written after the rules were frozen, never
used to tune them) or ``tuning`` (the rest, and the groups marked ``late``: written after
a first freeze, measured then, and used to tune the rules a second time). The script only
assembles and validates; every case is written by hand in corpus.txt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
LABELS = {"correction", "accept", "rephrase", "none"}


def assemble(text: str) -> list[dict[str, Any]]:
    """The cases of ``text`` in order; raises ValueError naming a malformed line."""
    cases: list[dict[str, Any]] = []
    group: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            parts = line[3:].split()
            tag = parts[-1] if parts[-1] in ("late", "blind") else ""
            parts = parts[:-1] if tag else parts
            group = {"shape": parts[0], "lang": parts[-1], "tag": tag}
            group.update(question="", answer="", vocabulary=[])
        elif line.startswith("Q: "):
            group["question"] = line[3:]
        elif line.startswith("A: "):
            group["answer"] = line[3:]
        elif line.startswith("V: "):
            group["vocabulary"] = [word.strip() for word in line[3:].split(",")]
        elif line.startswith("- "):
            said, _, label = line[2:].rpartition(" => ")
            signal, _, value = label.partition("=")
            if signal not in LABELS or not said or not group.get("answer"):
                raise ValueError(f"line {number}: malformed case {line!r}")
            if value and value.lower() not in said.lower():
                raise ValueError(f"line {number}: {value!r} is not in the follow-up")
            case_id = len(cases)
            cases.append(
                {
                    "id": case_id,
                    **group,
                    "follow_up": said,
                    "signal": signal,
                    "correction": value or None,
                    "part": _part(case_id, group["tag"]),
                }
            )
    return cases


def _part(case_id: int, tag: str) -> str:
    """Which part of the corpus a case is in (module doc)."""
    if tag == "blind":
        return "blind"
    if tag == "late":  # looked at when the rules were tuned a second time
        return "tuning"
    return "held out" if case_id % 4 == 3 else "tuning"


def main() -> None:
    """Write corpus.jsonl beside this file."""
    cases = assemble((HERE / "corpus.txt").read_text(encoding="utf-8"))
    lines = [json.dumps(case, ensure_ascii=False) for case in cases]
    (HERE / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
