"""What the model learners (sft, preference, rl) share: which model to train, where to
work, and the head's adapter to continue from."""

from __future__ import annotations

import shutil
from pathlib import Path

from reef.core.errors import InvalidInputError
from reef.learning.base import LearnerContext

ENGINE_SOURCES = frozenset({"smollm2-135m", "tiny-random"})


def is_local_model(name: str) -> bool:
    """True when the engine can load ``name`` (a built-in source or a model directory)."""
    return name in ENGINE_SOURCES or (Path(name) / "config.json").is_file()


def model_source(learner: str, configured: str | None, context: LearnerContext) -> str:
    """The engine model source to train: the configured one, else the head's base model.
    Raises ``InvalidInputError`` when neither is one the engine can load."""
    if configured is not None:
        return configured
    base = context.head.manifest.model.base
    if is_local_model(base):
        return base
    raise InvalidInputError(
        f"{learner}: the head's base model {base!r} is not a local engine model; set "
        "`model:` to smollm2-135m, tiny-random or a model directory"
    )


def fresh_work_dir(context: LearnerContext, learner: str) -> Path:
    """An empty working directory for one run of ``learner``."""
    work = context.work_dir / learner
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def head_adapter(
    context: LearnerContext, model: str, work: Path, continue_from_head: bool
) -> Path | None:
    """A verified copy of the head's adapter to continue from, or None when the head
    serves none, serves another base, or the learner starts fresh."""
    head = context.head.manifest.model
    if not continue_from_head or head.adapter is None or head.base != model:
        return None
    return context.artifacts.materialize(head.adapter, work / "base-adapter")
