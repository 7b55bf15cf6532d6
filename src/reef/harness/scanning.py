"""A simple scan of harness text for planted instructions, for release gates.

Every piece of text a harness carries is scanned — system prompt, instructions,
example messages (text and tool-call arguments), skills (all fields), memory, tool
descriptions (parameter descriptions included) and string params — against
``INJECTION_PATTERNS``, case-insensitively:

- ``ignore-previous``: "ignore / forget / override (all) previous|prior|above|earlier
  instructions|rules|prompts";
- ``disregard``: "disregard" followed by instructions, rules, the system, guidelines,
  or previous/prior/above/all/any/your;
- ``prompt-extraction``: asks to reveal, print, repeat, show, leak or output the system
  prompt, hidden/initial instructions;
- ``exfiltration-url``: a URL whose query carries a placeholder (``{…}``, ``$…``,
  ``<…>``) or names data (``data=``, ``secret=``, ``token=``, ``key=``, ``password=``,
  ``conversation=``, ``history=``), or a markdown image pointing at a URL with a query;
- ``send-to-url``: send/post/upload/forward … to an http(s) URL.

A finding reads ``"<where>: <pattern>: <excerpt>"``. Findings are evidence for a gate
or a reviewer, not proof; an empty list proves nothing either.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from reef.harness.model import Harness

INJECTION_PATTERNS: dict[str, re.Pattern[str]] = {
    "ignore-previous": re.compile(
        r"\b(ignore|forget|override)\s+(all\s+|any\s+|the\s+|your\s+)*"
        r"(previous|prior|above|earlier|preceding|original)\s+"
        r"(instructions?|rules?|prompts?|messages?|directions?)",
        re.IGNORECASE,
    ),
    "disregard": re.compile(
        r"\bdisregard\s+(all\s+|any\s+|the\s+|your\s+|previous\s+|prior\s+|above\s+)*"
        r"(instructions?|rules?|system|guidelines?|policy|policies|previous|prior|above)",
        re.IGNORECASE,
    ),
    "prompt-extraction": re.compile(
        r"\b(reveal|print|repeat|show|leak|output|disclose|dump|share)\b[^.\n]{0,40}"
        r"\b(system\s+prompt|hidden\s+instructions?|initial\s+instructions?|"
        r"developer\s+message)",
        re.IGNORECASE,
    ),
    "exfiltration-url": re.compile(
        r"https?://[^\s)\"'>]+[?&][\w.-]*=\s*(\{|\$|<|%7B)"
        r"|https?://[^\s)\"'>]+[?&](data|secret|token|key|password|conversation|history)="
        r"|!\[[^\]]*\]\(\s*https?://[^)\s]*\?[^)]*\)",
        re.IGNORECASE,
    ),
    "send-to-url": re.compile(
        r"\b(send|post|upload|forward|transmit|exfiltrate)\b[^.\n]{0,60}\bto\s+https?://",
        re.IGNORECASE,
    ),
}


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{where}[{index}]")


def harness_texts(harness: Harness) -> Iterator[tuple[str, str]]:
    """Every string in the harness, with where it is (``skills[0].content``, …)."""
    document = harness.model_dump(mode="json", exclude={"schema_version", "enforced_params"})
    for key, value in document.items():
        yield from _strings(value, key)


def scan_for_injection(harness: Harness) -> list[str]:
    """Findings of planted-instruction patterns in ``harness`` (module docstring)."""
    findings = []
    for where, text in harness_texts(harness):
        findings.extend(scan_text(text, where))
    return findings


def scan_value(value: Any, where: str) -> list[str]:
    """Findings in every string inside ``value`` (a string, or JSON-like lists and
    mappings), e.g. a feedback's text or correction before a learner may copy it."""
    findings = []
    for place, text in _strings(value, where):
        findings.extend(scan_text(text, place))
    return findings


def scan_text(text: str, where: str) -> list[str]:
    """Findings of ``INJECTION_PATTERNS`` in one string, ``"<where>: <pattern>: <excerpt>"``."""
    findings = []
    for name, pattern in INJECTION_PATTERNS.items():
        for match in pattern.finditer(text):
            excerpt = match.group(0)
            if len(excerpt) > 80:
                excerpt = excerpt[:77] + "..."
            findings.append(f"{where}: {name}: {excerpt!r}")
    return findings
