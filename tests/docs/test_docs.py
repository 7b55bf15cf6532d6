"""Docs that must not drift from the code."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from reef.config import ReefSettings
from reef.config.reference import reference_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    from reef.config.reference import _section_models

    seen.add(model)
    for field in model.model_fields.values():
        for child in _section_models(field.annotation):
            if child not in seen:
                _models(child, seen)


def test_every_setting_has_a_description() -> None:
    seen: set[type[BaseModel]] = set()
    _models(ReefSettings, seen)
    missing = [
        f"{model.__name__}.{name}"
        for model in seen
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert not missing, f"settings without a description: {missing}"


def test_configuration_reference_is_up_to_date() -> None:
    current = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert current == reference_markdown(), (
        "docs/configuration.md is stale: run `python -m reef.config.reference > "
        "docs/configuration.md`"
    )


def test_readme_gives_the_two_commands() -> None:
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    assert "reef serve" in readme
    assert "scripts/test" in readme
    ci = (DOCS.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/test" in ci
