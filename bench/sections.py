"""Rewriting one marked section of ``docs/benchmarks.md``, shared by the bench scripts."""

from __future__ import annotations

from pathlib import Path


def write_between(path: Path, start: str, end: str, body: str) -> None:
    """Replace the text between the ``start`` and ``end`` markers in ``path`` with
    ``body``; append the marked block when the markers (or the file) are absent."""
    block = f"{start}\n{body}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
