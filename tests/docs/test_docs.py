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
    assert "&& reef quickstart\n" in readme  # the main command ends in the quickstart
    assert "reef serve" in readme
    assert "scripts/test" in readme
    ci = (DOCS.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/test" in ci


def _route_paths() -> list[str]:
    from reef.gateway.routes import ROUTE_TABLE

    return [rule.path for rule in ROUTE_TABLE]


def test_every_route_is_documented() -> None:
    routes = _route_paths()
    assert len(routes) > 20, routes
    documented = (DOCS / "http-api.md").read_text(encoding="utf-8")
    # the docs abbreviate {scenario} as {s} and {*_id} as {id}
    missing = []
    for path in routes:
        short = path.replace("{scenario}", "{s}")
        for name in (
            "record_id",
            "session_id",
            "release_id",
            "candidate_id",
            "evaluation_id",
            "feedback_id",
            "response_id",
        ):
            short = short.replace("{" + name + "}", "{id}")
        if path not in documented and short not in documented:
            missing.append(path)
    assert not missing, f"routes missing from docs/http-api.md: {missing}"


def test_every_gate_setting_is_documented() -> None:
    from reef.evaluation.config import CanaryConfig, EpisodesConfig, GateConfig, SafetyConfig
    from reef.evaluation.shadow_config import ShadowConfig, ShadowJudgeConfig

    documented = (DOCS / "evaluation.md").read_text(encoding="utf-8")
    nested = {"safety", "canary"}
    names = [f"`{name}`" for name in GateConfig.model_fields if name not in nested]
    names += [f"`safety.{name}`" for name in SafetyConfig.model_fields]
    names += [f"`canary.{name}`" for name in CanaryConfig.model_fields]
    names += [f"`episodes.{name}`" for name in EpisodesConfig.model_fields]
    names += [f"`shadow.{name}`" for name in ShadowConfig.model_fields]
    names += [f"`shadow.judge.{name}`" for name in ShadowJudgeConfig.model_fields]
    missing = [name for name in names if name not in documented]
    assert not missing, f"gate settings missing from docs/evaluation.md: {missing}"
