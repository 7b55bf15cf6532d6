"""The teacher and escalation rules of a distilled scenario (docs/distillation.md): one
definition that the release manifest's ``routing`` component and the configuration's
``scenarios.<s>.distill`` section both use, in ``core`` so that loading the configuration
imports no release code.

Also here, because the gateway, selection, the learning worker and the canary monitor all
read them: the tag that says which arm answered a routed record (``SERVED_BY_TAG``), and
which records a live teacher check covers (``teacher_checked``: a draw from the record's
id, independent of the arm's draw, so the checked records are an unbiased sample of both
arms).
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field

# The tag the gateway writes on a routed record: the arm whose answer was returned.
SERVED_BY_TAG = "reef.served_by"
# The ``source`` (and principal prefix) of the feedback a live teacher check writes.
TEACHER_CHECK_SOURCE = "teacher"

_HASH_RANGE = 1 << 64


def teacher_checked(record_id: str, fraction: float) -> bool:
    """Whether the record ``record_id`` falls in a live teacher check's ``fraction``
    (a keyed hash of the id, so every reader agrees and the arm's draw is independent)."""
    digest = hashlib.blake2b(record_id.encode(), digest_size=8, key=b"reef.teacher-check")
    return int.from_bytes(digest.digest(), "big") / _HASH_RANGE < fraction


def teacher_label(teacher: TeacherEndpoint) -> str:
    """The author name of evidence Reef took from ``teacher``: ``teacher:<upstream>/<model>``."""
    return f"{TEACHER_CHECK_SOURCE}:{teacher.upstream}/{teacher.model}"


class TeacherEndpoint(BaseModel):
    """Where the teacher of a distilled scenario answers: a configured upstream and a
    model name on it (docs/distillation.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream: str = Field(min_length=1, description="Name of the teacher's upstream.")
    model: str = Field(min_length=1, description="The teacher's model name on that upstream.")


class EscalationRules(BaseModel):
    """When the student's answer is replaced by the teacher's (docs/distillation.md).

    A non-streaming request escalates before any byte reaches the client; a streaming
    request routes by share, or buffers ``stream_buffer_tokens`` first when that is > 0.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_mean_logprob: float | None = Field(
        default=None,
        le=0.0,
        description="Escalate when the student's mean token logprob is below this (a "
        "calibrated, negative number); null: this rule is off.",
    )
    invalid_tool_calls: bool = Field(
        default=True,
        description="Escalate a tool call whose name is not among the request's tools or "
        "whose arguments are not JSON valid against the tool's parameters.",
    )
    invalid_json: bool = Field(
        default=True,
        description="Escalate an answer that does not validate against the request's "
        "`response_format` (JSON object or JSON schema).",
    )
    refusal_or_empty: bool = Field(
        default=True, description="Escalate an empty answer or a refusal."
    )
    header: bool = Field(
        default=True,
        description="Honour the request header `x-reef-escalate: teacher` (always ask the "
        "teacher for this request).",
    )
    stream_buffer_tokens: int = Field(
        default=0,
        ge=0,
        description="Streaming: buffer this many of the student's tokens before committing "
        "(the rules above run on them); 0: streams route by share only.",
    )
