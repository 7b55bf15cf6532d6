"""Eval suites: what the gate asks both arms.

- File suites (``load_suite``): JSONL (one item per line) or YAML (a list of items, or a
  mapping with ``items:`` and an optional suite-wide ``scorer:``). An item::

      {"id": "refund-1",                       # optional: default line/position number
       "messages": [{"role": "user", "content": "..."}],   # or "input": "text"
       "reference": "billing",                 # or "expected"; what a right answer is
       "scorer": {"type": "contains"},         # optional; else the suite's, else the gate's
       "tags": ["refunds"], "params": {"max_tokens": 16}}

- Holdout experience: records kept out of training, built by the worker (it owns
  experience selection) into items of suite ``holdout``.
- Regression suites (``regression_suites``): the items that admitted each of the last
  releases published by the gate, under ``regression:<release id>``.
- Safety probes: ``reef.evaluation.safety``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from reef.core.errors import InvalidInputError
from reef.evaluation.results import EvaluationStore
from reef.evaluation.values import EvalItem
from reef.releases import Release

_ITEM_KEYS = {"id", "messages", "input", "reference", "expected", "scorer", "tags", "params"}


class SuiteError(InvalidInputError):
    """A suite file is missing, unreadable or has a bad item; the message says where."""


def load_suite(path: Path, name: str | None = None) -> list[EvalItem]:
    """The items of a JSONL or YAML suite file, in file order, suite ``file:<stem>``
    (or ``file:<name>``). Raises ``SuiteError`` naming the file, item and problem."""
    suite = f"file:{name or path.stem}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SuiteError(f"cannot read suite {path}: {error.strerror or error}") from error
    default_scorer: dict[str, Any] | None = None
    if path.suffix.lower() == ".jsonl":
        entries = list(_jsonl(text, path))
    elif path.suffix.lower() in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise SuiteError(f"suite {path} is not valid YAML: {error}") from error
        if isinstance(data, dict):
            unknown = set(data) - {"items", "scorer"}
            if unknown:
                raise SuiteError(
                    f"suite {path}: unknown key(s) {sorted(unknown)}; allowed: items, scorer"
                )
            default_scorer = _scorer(data.get("scorer"), f"suite {path}")
            data = data.get("items")
        if not isinstance(data, list):
            raise SuiteError(f"suite {path}: expected a list of items (or a mapping with items)")
        entries = [(f"item {index + 1}", entry) for index, entry in enumerate(data)]
    else:
        raise SuiteError(f"suite {path}: use a .jsonl, .yaml or .yml file")
    items = [_item(entry, where, path, suite, default_scorer) for where, entry in entries]
    if not items:
        raise SuiteError(f"suite {path} has no items")
    keys = [item.id for item in items]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise SuiteError(f"suite {path}: duplicate item ids {duplicates}")
    return items


def _jsonl(text: str, path: Path) -> Iterable[tuple[str, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as error:
            raise SuiteError(f"suite {path}, line {number}: not valid JSON: {error}") from error


def _scorer(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return {"type": value}
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        return dict(value)
    raise SuiteError(f"{where}: scorer must be a type name or a mapping with 'type'")


def _item(
    entry: Any, where: str, path: Path, suite: str, default_scorer: dict[str, Any] | None
) -> EvalItem:
    at = f"suite {path}, {where}"
    if not isinstance(entry, dict):
        raise SuiteError(f"{at}: an item must be an object")
    unknown = set(entry) - _ITEM_KEYS
    if unknown:
        raise SuiteError(
            f"{at}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(_ITEM_KEYS))}"
        )
    messages = entry.get("messages")
    if messages is None and isinstance(entry.get("input"), str):
        messages = [{"role": "user", "content": entry["input"]}]
    if not isinstance(messages, list) or not messages:
        raise SuiteError(f"{at}: give 'messages' (a non-empty list) or 'input' (a string)")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise SuiteError(f"{at}: messages[{index}] must be an object with a 'role'")
    tags = entry.get("tags") or []
    params = entry.get("params") or {}
    if not isinstance(tags, list) or not isinstance(params, dict):
        raise SuiteError(f"{at}: 'tags' must be a list and 'params' an object")
    number = where.split()[-1]
    return EvalItem(
        id=str(entry.get("id", number)),
        suite=suite,
        messages=messages,
        reference=entry.get("reference", entry.get("expected")),
        scorer=_scorer(entry.get("scorer"), at) or default_scorer,
        tags=tuple(str(tag) for tag in tags),
        params=dict(params),
    )


def regression_suites(
    evaluations: EvaluationStore, releases: Iterable[Release], count: int
) -> list[EvalItem]:
    """The items that admitted the newest ``count`` gate-published releases among
    ``releases`` (newest first), each under suite ``regression:<release id>``.

    A release names the evaluation that admitted it in ``evidence["gate"]
    ["evaluation_id"]``; only its current-suite items (file suites and holdout) carry
    over — not its own regression or safety items, nor an environment's tasks.
    """
    items: list[EvalItem] = []
    taken = 0
    for release in releases:
        if taken >= count:
            break
        gate = (release.evidence or {}).get("gate")
        evaluation_id = gate.get("evaluation_id") if isinstance(gate, dict) else None
        if not isinstance(evaluation_id, str):
            continue
        taken += 1
        suite = f"regression:{release.id}"
        for item in evaluations.items(evaluation_id):
            # Tasks are played, not asked: a later gate plays its own episodes.
            if is_current_suite(item.suite) and not is_episode_suite(item.suite):
                items.append(
                    EvalItem(
                        id=f"{item.suite}/{item.id}",
                        suite=suite,
                        messages=item.messages,
                        reference=item.reference,
                        scorer=item.scorer,
                        tags=item.tags,
                        params=item.params,
                        provenance=item.provenance,
                    )
                )
    return items


SHADOW_SUITE = "shadow"
"""The suite of shadow pairs: live answers against the candidate's (``evaluation.shadow``)."""


def is_current_suite(suite: str) -> bool:
    """Whether ``suite`` counts toward the overall gain (file suites, holdout, the
    episodes of ``gate.episodes`` and shadow results: ``shadow`` or ``shadow:<name>``)."""
    return suite in ("holdout", SHADOW_SUITE) or suite.startswith(("file:", "env:", "shadow:"))


def evidence_kind(suite: str) -> str:
    """The kind of a current suite, as ``gate.evidence_weights`` names it: ``holdout``,
    ``suites`` (file suites), ``episodes`` or ``shadow``."""
    if suite == "holdout":
        return "holdout"
    if suite.startswith("env:"):
        return "episodes"
    if suite == SHADOW_SUITE or suite.startswith("shadow:"):
        return SHADOW_SUITE
    return "suites"


def is_episode_suite(suite: str) -> bool:
    """Whether ``suite`` holds an environment's tasks (``env:<type>``), played as
    episodes rather than asked as one chat item."""
    return suite.startswith("env:")
