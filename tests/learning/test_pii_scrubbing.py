"""Personal data in what the harness learners copy: the detector's recall on a labelled
set (printed in the test run's output), and the fewshot learner's demos scrubbed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from reef.experience import SCRUBBED_KINDS, find_personal_data, scrub_personal_text
from reef.learning.learners import FewShotConfig, FewShotLearner
from reef.learning.learners.fewshot import demonstration
from tests.learning.test_fewshot import example, harness_of, make_context

LABELLED = Path(__file__).parent / "data" / "pii_labelled.jsonl"
# Floors under what the labelled set measured (0.992 recall: 249 of 251 spans; 0 of 145
# clean strings flagged); a detector change that drops below them fails here.
MIN_RECALL = 0.97
MAX_FALSE_POSITIVE_RATE = 0.02


def _labelled() -> list[dict[str, Any]]:
    return [json.loads(line) for line in LABELLED.read_text("utf-8").splitlines() if line]


def _caught(text: str, span: str, found: list[Any]) -> bool:
    """Whether the detector's spans cover (90% of the non-space characters of) ``span``."""
    start = text.index(span)
    chars = [i for i in range(start, start + len(span)) if not text[i].isspace()]
    covered = [i for i in chars if any(f.start <= i < f.end for f in found)]
    return len(covered) >= 0.9 * len(chars)


def test_recall_and_false_positives_on_the_labelled_set(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _labelled()
    assert len(rows) >= 200
    spans = caught = typed = clean = flagged = 0
    by_kind: Counter[str] = Counter()
    missed_by_kind: Counter[str] = Counter()
    misses = []
    for row in rows:
        text = row["text"]
        found = [f for f in find_personal_data(text) if f.kind in SCRUBBED_KINDS]
        if not row["pii"]:
            clean += 1
            flagged += bool(found)
            continue
        for label in row["pii"]:
            spans += 1
            by_kind[label["kind"]] += 1
            if _caught(text, label["text"], found):
                caught += 1
                start = text.index(label["text"])
                end = start + len(label["text"])
                typed += any(
                    f.kind == label["kind"] and f.start < end and start < f.end for f in found
                )
            else:
                missed_by_kind[label["kind"]] += 1
                misses.append(f"{label['kind']}: {label['text']!r}")
    recall, false_positive_rate = caught / spans, flagged / clean
    per_kind = ", ".join(
        f"{kind} {by_kind[kind] - missed_by_kind[kind]}/{by_kind[kind]}" for kind in sorted(by_kind)
    )
    with capsys.disabled():  # the figure is the point of this test: always show it
        print(
            f"\nPII recall on {LABELLED.name}: {caught}/{spans} = {recall:.3f} "
            f"(right placeholder {typed / spans:.3f}); false positives on clean strings: "
            f"{flagged}/{clean} = {false_positive_rate:.3f}\n  by kind: {per_kind}\n"
            f"  missed: {'; '.join(misses) or 'none'}"
        )
    assert recall >= MIN_RECALL, misses
    assert false_positive_rate <= MAX_FALSE_POSITIVE_RATE


def test_every_labelled_string_reaches_a_fewshot_demo_scrubbed() -> None:
    for row in _labelled():
        demo = demonstration(example(row["text"], reply=row["text"]), Counter())
        assert demo is not None
        expected = scrub_personal_text(row["text"])
        assert [m["content"] for m in demo.messages] == [expected, expected]
        found = [f for f in find_personal_data(row["text"]) if f.kind in SCRUBBED_KINDS]
        for label in row["pii"]:
            if _caught(row["text"], label["text"], found):
                assert label["text"] not in demo.messages[0]["content"]


def test_the_fewshot_harness_holds_placeholders_not_the_customers_data(tmp_path: Path) -> None:
    call = {
        "id": "call_1",
        "name": "lookup_customer",
        "arguments": '{"email": "dana.r@example.com", "phone": "+44 20 7946 0958"}',
    }
    corrected = example(
        "My card 4111 1111 1111 1111 was charged twice, call me on (555) 010-0100",
        reply="no",
        score=0.0,
        correction="Sorry Dana! I refunded card 4111 1111 1111 1111; we will call 555-0100.",
    )
    tool_turn = example("find my account", reply="", score=1.0)
    tool_turn.messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    context = make_context(tmp_path, [corrected, tool_turn])
    output = FewShotLearner(FewShotConfig(k=4)).learn(context)
    harness = harness_of(context, output.harness)
    dumped = json.dumps([e.model_dump(mode="json") for e in harness.examples])
    for secret in ("4111 1111 1111 1111", "010-0100", "555-0100", "dana.r@", "7946 0958"):
        assert secret not in dumped
    assert "<CARD>" in dumped and "<PHONE>" in dumped and "<EMAIL>" in dumped
    assert output.metrics["scrubbed"] == {"CARD": 2, "EMAIL": 1, "PHONE": 3}
    # tool-call arguments stay valid JSON with the placeholders inside
    arguments = next(
        call["function"]["arguments"]
        for e in harness.examples
        for m in e.messages
        for call in m.get("tool_calls") or ()
    )
    assert json.loads(arguments) == {"email": "<EMAIL>", "phone": "<PHONE>"}


def test_scrubbing_can_be_turned_off_for_synthetic_data(tmp_path: Path) -> None:
    context = make_context(tmp_path, [example("call 555-0100", correction="Dial 555-0100.")])
    output = FewShotLearner(FewShotConfig(scrub_personal_data=False)).learn(context)
    assert "555-0100" in json.dumps(harness_of(context, output.harness).model_dump(mode="json"))
    assert output.metrics["scrubbed"] == {}
