"""A release manifest with and without the routing component of a distilled scenario."""

from __future__ import annotations

import pytest

from reef.core.errors import InvalidInputError
from reef.releases import (
    EscalationRules,
    ModelComponent,
    ReleaseManifest,
    RoutingComponent,
    TeacherEndpoint,
)

ADAPTER = "sha256:" + "a" * 64


def test_a_manifest_without_routing_serializes_as_before() -> None:
    manifest = ReleaseManifest(model=ModelComponent(base="smollm2-135m"))
    data = manifest.to_json()
    assert "routing" not in data
    assert data == {
        "schema_version": 1,
        "model": {"base": "smollm2-135m", "adapter": None},
        "harness": None,
        "recipe": None,
    }
    assert ReleaseManifest.from_json(data) == manifest


def test_routing_round_trips() -> None:
    manifest = ReleaseManifest(
        model=ModelComponent(base="smollm2-135m", adapter=ADAPTER),
        recipe="distill",
        routing=RoutingComponent(
            student_share=0.1,
            teacher=TeacherEndpoint(upstream="openai", model="gpt-5-mini"),
            escalation=EscalationRules(min_mean_logprob=-0.8, stream_buffer_tokens=16),
        ),
    )
    data = manifest.to_json()
    assert data["routing"]["student_share"] == 0.1
    assert data["routing"]["teacher"] == {"upstream": "openai", "model": "gpt-5-mini"}
    assert data["routing"]["escalation"]["min_mean_logprob"] == -0.8
    assert ReleaseManifest.from_json(data) == manifest
    assert manifest.digests() == {ADAPTER}


@pytest.mark.parametrize(
    ("routing", "field"),
    [
        ({"student_share": 1.5, "teacher": {"upstream": "u", "model": "m"}}, "student_share"),
        ({"student_share": 0.5, "teacher": {"upstream": "", "model": "m"}}, "upstream"),
        (
            {
                "student_share": 0.5,
                "teacher": {"upstream": "u", "model": "m"},
                "escalation": {"min_mean_logprob": 0.5},
            },
            "min_mean_logprob",
        ),
    ],
)
def test_bad_routing_is_refused_naming_the_field(routing: dict[str, object], field: str) -> None:
    data = {"model": {"base": "b"}, "routing": routing}
    with pytest.raises(InvalidInputError, match=field):
        ReleaseManifest.from_json(data)
