"""What every harness learner shares: the head's bundle in, a new bundle out."""

from __future__ import annotations

from typing import Any

from reef.harness import Bundle, Harness, pack_bundle, read_bundle_archive
from reef.learning.base import LearnerContext


def head_bundle(context: LearnerContext) -> Bundle:
    """The head's harness bundle, or an empty harness when the head has none."""
    digest = context.head.manifest.harness
    if digest is None:
        return Bundle(Harness(schema_version=1))
    return read_bundle_archive(context.artifacts.read_bytes(digest))


def replace_fields(bundle: Bundle, **fields: Any) -> Bundle:
    """``bundle`` with some harness fields replaced (validated again), files kept."""
    document = bundle.harness.model_dump(mode="json")
    document.update(fields)
    return Bundle(Harness.model_validate(document), bundle.files)


def store_bundle(context: LearnerContext, bundle: Bundle) -> str:
    """Pack ``bundle`` deterministically and store it as a ``harness`` artifact."""
    return context.artifacts.put_bytes(pack_bundle(bundle), "harness")
