"""Which recorded answers a distilled scenario's teacher gave, and what they teach.

A distilled scenario's release carries a routing component (``ReleaseManifest.routing``):
the student (the manifest's model) answers a share of requests, the teacher the rest.
An answer is the teacher's when its record says so (tag ``reef.served_by: teacher``: routed to
the teacher, or escalated to it), or, for a record that does not say, when its release
routed everything to the teacher (``student_share: 0``, how a distilled scenario
starts). A record of a release without routing is never the teacher's.

What such an answer teaches (``teacher_reference``) follows the feedback on it: a
correction replaces it, negative feedback (a score below ``drop_below``) drops it, and
no feedback at all keeps it as it is. Shared by the ``distill`` learner (its training
targets) and the gate's held-out items (``gate.holdout_teacher_references``).
"""

from __future__ import annotations

from typing import Any

from reef.core.errors import NotFoundError
from reef.experience import is_tool_call_correction
from reef.learning.base import TrainingExample
from reef.releases import ReleaseChain, ReleaseManifest

# A mean feedback score below this is negative feedback (the scale calibration reads).
NEGATIVE_BELOW = 0.5


def answered_by_teacher(example: TrainingExample, manifest: ReleaseManifest | None) -> bool:
    """Whether the teacher gave ``example``'s answer, ``manifest`` being its release's
    (module docstring)."""
    if manifest is None or manifest.routing is None:
        return False
    if example.served_by is not None:
        return example.served_by == "teacher"
    return manifest.routing.student_share == 0.0


def teacher_reference(example: TrainingExample, drop_below: float = NEGATIVE_BELOW) -> Any:
    """What a teacher's answer teaches: the correction when feedback gave one (text,
    or ``{"tool_calls": [...]}``), None when feedback scored it below ``drop_below``,
    else the answer itself (its tool calls when it made any, else its text; None when
    it is empty)."""
    if example.correction is not None:
        if is_tool_call_correction(example.correction):
            return {"tool_calls": example.correction["tool_calls"]}
        return example.correction
    if example.score is not None and example.score < drop_below:
        return None
    response = example.response or {}
    if response.get("tool_calls"):
        return {"tool_calls": response["tool_calls"]}
    content = response.get("content")
    return content if isinstance(content, str) and content else None


class ReleaseManifests:
    """Release manifests by id, read from ``chain`` once each (None: no such release)."""

    def __init__(self, chain: ReleaseChain) -> None:
        self.chain = chain
        self._seen: dict[str, ReleaseManifest | None] = {}

    def __call__(self, release_id: str) -> ReleaseManifest | None:
        """The manifest of the release ``release_id``, or None when it does not exist."""
        if release_id not in self._seen:
            try:
                self._seen[release_id] = self.chain.get_release(release_id).manifest
            except NotFoundError:
                self._seen[release_id] = None
        return self._seen[release_id]
