"""Release manifests: what a release or candidate serves, every component by digest.

A manifest crosses boundaries (database rows, HTTP, files), so it is a pydantic model
with a ``schema_version``. Digests are ``"sha256:<64 lowercase hex>"`` as written by the
artifact store (``reef.core.digests``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from reef.core.errors import InvalidInputError
from reef.core.routing import EscalationRules, TeacherEndpoint

__all__ = [
    "EscalationRules",
    "ModelComponent",
    "ReleaseManifest",
    "RoutingComponent",
    "TeacherEndpoint",
]

DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")


def _checked_digest(value: str | None, what: str) -> str | None:
    if value is not None and not DIGEST_PATTERN.fullmatch(value):
        raise ValueError(f"{what} must be an artifact digest 'sha256:<64 hex>', got {value!r}")
    return value


class ModelComponent(BaseModel):
    """The model half of a release: a base model, optionally a checkpoint of it (full
    fine-tuned weights that replace the base's), optionally a LoRA adapter on top (of
    the checkpoint when there is one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base: str = Field(min_length=1, description="Base model name, as the upstream knows it.")
    checkpoint: str | None = Field(
        default=None,
        description="Digest of a checkpoint artifact (the base's weights, fine-tuned), or "
        "null for the base's own weights.",
    )
    adapter: str | None = Field(
        default=None, description="Digest of the adapter artifact, or null for the bare base."
    )

    @field_validator("adapter")
    @classmethod
    def _adapter_is_a_digest(cls, value: str | None) -> str | None:
        return _checked_digest(value, "model.adapter")

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_is_a_digest(cls, value: str | None) -> str | None:
        return _checked_digest(value, "model.checkpoint")

    @model_serializer(mode="wrap")
    def _without_absent_checkpoint(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A manifest without a checkpoint serializes as it did before checkpoints
        # existed: stored manifests, records and clients see the same JSON.
        data: dict[str, Any] = handler(self)
        if data.get("checkpoint") is None:
            data.pop("checkpoint", None)
        return data


class RoutingComponent(BaseModel):
    """The routing half of a distilled scenario's release: the student (the manifest's
    ``model``) answers ``student_share`` of requests, escalating to the teacher when a rule
    fires; the teacher answers the rest. Absent: the model component serves everything,
    as before distillation existed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    student_share: float = Field(
        ge=0.0, le=1.0, description="The share of requests the student answers first (0..1)."
    )
    teacher: TeacherEndpoint
    escalation: EscalationRules = Field(default_factory=EscalationRules)


class ReleaseManifest(BaseModel):
    """The components a release serves (DESIGN.md §3, without ``parent``/``operation``,
    which belong to the release row and are added by ``Release.manifest_json()``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    model: ModelComponent
    harness: str | None = Field(
        default=None, description="Digest of the harness bundle, or null for none."
    )
    recipe: str | None = Field(
        default=None, description="Name of the recipe that produced it, or null."
    )
    routing: RoutingComponent | None = Field(
        default=None,
        description="Teacher/student routing of a distilled scenario, or null: the model "
        "component serves everything.",
    )

    @field_validator("harness")
    @classmethod
    def _harness_is_a_digest(cls, value: str | None) -> str | None:
        return _checked_digest(value, "harness")

    @model_serializer(mode="wrap")
    def _without_absent_routing(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A manifest without routing serializes as it did before distillation existed.
        data: dict[str, Any] = handler(self)
        if data.get("routing") is None:
            data.pop("routing", None)
        return data

    def digests(self) -> set[str]:
        """The artifact digests this manifest references (checkpoint, adapter, harness)."""
        model = self.model
        return {d for d in (model.checkpoint, model.adapter, self.harness) if d is not None}

    def to_json(self) -> dict[str, Any]:
        """The manifest as a JSON-ready dict."""
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Any) -> ReleaseManifest:
        """Parse a manifest dict; keys of the release row (``parent``, ``operation``) are
        ignored. Raises ``InvalidInputError`` naming what is wrong."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k not in ("parent", "operation")}
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise InvalidInputError(f"invalid release manifest: {error}") from error
