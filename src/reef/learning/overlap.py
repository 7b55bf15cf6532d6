"""Evidence kept apart from training: records whose prompt is an item of the gate's suites.

A candidate scored on items it was trained on proves nothing. Selection therefore leaves
out of training every record whose prompt (its last user message) matches the prompt of
an item of the recipe's file suites (``gate.suites``):

- the same text once normalised (``normalised_prompt``: lowercase, whitespace collapsed,
  punctuation stripped at both ends), compared by hash; or
- a near-duplicate: character 3-gram Jaccard similarity of the normalised texts at least
  ``NEAR_DUPLICATE_JACCARD`` (0.9). Character 3-grams, not words, because the prompts
  that leak are short messages (an order number, a name) where one changed word moves a
  word-level Jaccard by a third, while a typo or an added "please" barely moves the
  3-gram sets; 0.9 keeps a suite item and its lightly edited copy together and tells
  apart two messages that share only a template ("my order is 1234" vs "… 5678").
  A near-duplicate must also carry the same numbers (digit runs, in order): in a short
  prompt one changed digit ("capital 4" vs "capital 40") moves the 3-gram Jaccard by
  less than a tenth, yet asks another question. It needs no model and is bounded by the
  two texts' lengths.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

NEAR_DUPLICATE_JACCARD = 0.9
_SPACE = re.compile(r"\s+")
_NUMBER = re.compile(r"\d+")
_EDGE = string.punctuation + "\u00a1\u00bf\u2018\u2019\u201c\u201d\u2026"


@dataclass(frozen=True)
class SuitePrompt:
    """One suite item's prompt: its key (``<suite>/<id>``) and its last user message."""

    key: str
    prompt: str


def normalised_prompt(text: str) -> str:
    """``text`` lowercased, its whitespace collapsed, punctuation stripped at both ends."""
    return _SPACE.sub(" ", text.lower()).strip().strip(_EDGE).strip()


def prompt_hash(text: str) -> str:
    """The sha256 of ``normalised_prompt(text)``."""
    return hashlib.sha256(normalised_prompt(text).encode()).hexdigest()


def trigrams(text: str) -> frozenset[str]:
    """The character 3-grams of ``text`` (the text itself when shorter)."""
    if len(text) < 3:
        return frozenset([text]) if text else frozenset()
    return frozenset(text[i : i + 3] for i in range(len(text) - 2))


def jaccard(first: frozenset[str], second: frozenset[str]) -> float:
    """Shared 3-grams over all 3-grams of the two (0 when both are empty)."""
    union = len(first | second)
    return len(first & second) / union if union else 0.0


class SuiteMatcher:
    """Finds the suite item a prompt matches (module docstring), if any."""

    def __init__(self, prompts: Iterable[SuitePrompt]) -> None:
        self._by_hash: dict[str, str] = {}
        self._grams: list[tuple[str, frozenset[str], tuple[str, ...]]] = []
        for item in prompts:
            text = normalised_prompt(item.prompt)
            if not text:
                continue
            self._by_hash.setdefault(hashlib.sha256(text.encode()).hexdigest(), item.key)
            self._grams.append((item.key, trigrams(text), tuple(_NUMBER.findall(text))))

    def __bool__(self) -> bool:
        return bool(self._grams)

    def match(self, prompt: str) -> str | None:
        """The key of the suite item ``prompt`` matches, else None."""
        text = normalised_prompt(prompt)
        if not text:
            return None
        exact = self._by_hash.get(hashlib.sha256(text.encode()).hexdigest())
        if exact is not None:
            return exact
        grams, numbers = trigrams(text), tuple(_NUMBER.findall(text))
        for key, theirs, their_numbers in self._grams:
            if numbers != their_numbers:
                continue
            # Jaccard >= t needs the smaller set to be at least t of the larger: a cheap
            # test that skips most pairs before any set is intersected.
            small, large = sorted((len(grams), len(theirs)))
            near = large and small >= NEAR_DUPLICATE_JACCARD * large
            if near and jaccard(grams, theirs) >= NEAR_DUPLICATE_JACCARD:
                return key
        return None


def last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the last user message of ``messages`` (text parts joined), or ""."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    str(part.get("text", "")) for part in content if isinstance(part, dict)
                )
            return ""
    return ""
