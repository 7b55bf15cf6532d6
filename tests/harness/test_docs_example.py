"""The harness.yaml shown in docs/harness.md is valid and behaves as described."""

from __future__ import annotations

import re
from pathlib import Path

from reef.harness import parse_harness_yaml, relevant_skills, render_anthropic, render_openai

DOC = Path(__file__).resolve().parents[2] / "docs" / "harness.md"


def test_documented_harness_yaml_is_valid() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks, "docs/harness.md shows no harness.yaml"
    harness = parse_harness_yaml(blocks[0].encode())
    question = "How do I update firmware?"
    assert [s.name for s in relevant_skills(harness, question)] == ["firmware-update"]
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 9}
    assert render_openai(harness, body)["max_tokens"] == 400  # enforced
    assert render_anthropic(harness, body)["stop_sequences"] == ["</answer>"]
