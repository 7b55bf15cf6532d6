"""The contracts every learner and the worker share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from reef.core import Progress
from reef.core.errors import InvalidInputError
from reef.core.trust import Trust
from reef.releases import ArtifactStore, Release, ReleaseManifest, RoutingComponent


@dataclass(frozen=True)
class TrainingExample:
    """One unit of experience, ready for a learner.

    ``messages`` is the canonical OpenAI-form conversation up to the reply (system prompt
    included); ``response`` the assistant reply that was served (canonical form);
    ``correction`` the better answer a feedback gave, if any (a string; for tool calls a
    canonical assistant message with ``tool_calls``; else the raw value); ``score`` the
    mean feedback score (for a turn of a session with an outcome, its credited share,
    ``reef.learning.credit``, averaged with its own record's). ``weight`` < 1 marks
    down-weighted (stale) items. ``tools`` are the tools the request offered (OpenAI
    function form) and ``tool_choice`` its choice, so a replay offers the same.
    ``chat_messages`` is the same conversation in OpenAI chat form, lossless (images,
    content parts and tool history as the client sent them, ``reef.experience
    .chat_messages``); None when the example was not built from a record.
    """

    record_id: str
    scenario: str
    session_id: str
    messages: list[dict[str, Any]]
    response: dict[str, Any] | None
    score: float | None
    correction: Any
    feedback: list[Any]
    principals: list[str | None]
    release_id: str | None
    staleness: int
    content_hash: str
    weight: float = 1.0
    # Every record folded into this example (a merged session's turns), ``record_id``
    # included; empty means just ``record_id``. Learners report these as consumed.
    source_ids: tuple[str, ...] = ()
    # (principal, trust) of the feedback that decided the reference: the last
    # correction's author, else every author who scored it. The gate weighs evidence by it.
    reference_authors: tuple[tuple[str | None, Trust], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None
    chat_messages: list[dict[str, Any]] | None = None
    # A conversation signal complained about the answer and no feedback gave the right
    # value (``complaint_without_value`` in the selection stats).
    complaint_without_value: bool = False
    # The record's tags (``x-reef-tag-<name>`` headers): the gate's protected slices.
    tags: dict[str, str] = field(default_factory=dict)
    # Who answered, in a distilled scenario whose release routes between a student and a
    # teacher (the record's ``reef.served_by`` tag); None: the record does not say.
    served_by: Literal["student", "teacher"] | None = None
    # The served reply's token logprobs, when the upstream sent them (a chat record's
    # first choice's ``logprobs.content``: each token's text, logprob and
    # ``top_logprobs``): a teacher asked for them is what logit distillation reads.
    token_logprobs: tuple[dict[str, Any], ...] = ()

    def target_text(self) -> str | None:
        """What the model should have said: the correction if any, else the reply's text.
        None for a correction made of tool calls (an assistant message with
        ``tool_calls``): it has no text to train on as text."""
        if self.correction is not None:
            if isinstance(self.correction, dict) and "tool_calls" in self.correction:
                return None
            return self.correction if isinstance(self.correction, str) else str(self.correction)
        if self.response is not None:
            content = self.response.get("content")
            return content if isinstance(content, str) else None
        return None


@dataclass(frozen=True)
class ExperienceBatch:
    """What ``select_experience`` returns: training items, the holdout no learner may
    train on, and counts of what was dropped and why."""

    train: list[TrainingExample]
    holdout: list[TrainingExample]
    stats: dict[str, int] = field(default_factory=dict)
    # Feedback id -> why screening flagged it (``reef.learning.screening``); the worker
    # quarantines these. Flagged feedback is already left out of ``train`` and ``holdout``.
    flagged: dict[str, str] = field(default_factory=dict)
    # A bounded sample of what earlier published releases learned from (their consumed
    # records), for model learners that continue from the head's adapter to replay.
    replay: list[TrainingExample] = field(default_factory=list)
    # Record id -> the suite item (``<suite>/<id>``) its prompt matched: left out of
    # ``train`` so the gate never scores what the candidate learned (``reef.learning.overlap``).
    overlap: dict[str, str] = field(default_factory=dict)


class LearnerConfig(BaseModel):
    """Base of a learner's settings (the recipe entry minus ``type``).

    ``reflector_upstream`` / ``reflector_model`` choose the model ``context.reflector``
    asks (any configured upstream and model); by default the scenario's own.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    reflector_upstream: str | None = None
    reflector_model: str | None = None


class Reflector(Protocol):
    """A configured model that reflective learners ask (the scenario's own by default)."""

    def reflect(self, messages: list[dict[str, Any]]) -> str:
        """The model's reply text to ``messages`` (OpenAI chat form). Raises
        ``ReflectError`` when the model cannot be asked or answers with no text."""


class Metrics(Protocol):
    """Where a learner records named values for its job (the dashboard plots them)."""

    def record(self, name: str, value: float) -> None:
        """Record ``value`` under ``name``; a name recorded again keeps every value."""


class MetricLog:
    """``Metrics`` kept in memory: one value per name, a list once a name repeats."""

    def __init__(self) -> None:
        self.values: dict[str, float | list[float]] = {}

    def record(self, name: str, value: float) -> None:
        """Keep ``value`` (after the earlier values of ``name``, if any)."""
        previous = self.values.get(name)
        if previous is None:
            self.values[name] = value
        elif isinstance(previous, list):
            previous.append(value)
        else:
            self.values[name] = [previous, value]


@dataclass
class LearnerContext:
    """What a learner gets for one run: its scenario and head, the experience, where to
    keep artifacts and files, and three objects to talk back through — ``reflector``
    (asks a configured model), ``progress`` (how far the run got) and ``metrics`` (named
    values for the job). ``harness_mode`` is the scenario's ``harness`` setting: under
    ``managed`` the gateway renders the serving release's harness into every request,
    so its records hold the client's request without it (model learners render it back
    in to train as served: ``render_harness``). ``training_minutes`` is what the
    learning budget's training minutes have left on the device the learner trains on
    (None: no such budget); a model learner's trainer stops there."""

    scenario: str
    head: Release
    batch: ExperienceBatch
    artifacts: ArtifactStore
    home: Path
    work_dir: Path
    reflector: Reflector
    progress: Progress
    metrics: Metrics
    harness_mode: Literal["managed", "client"] = "client"
    training_minutes: float | None = None
    # The manifest of the release with this id (None: unknown), for learners that ask
    # which release answered a record (``distill``: the teacher's answers).
    release_manifest: Callable[[str], ReleaseManifest | None] = field(
        default=lambda _release_id: None
    )
    # A distilled scenario's first rollout step (its configured student share of the
    # traffic), the share ``distill`` proposes unless its own setting says; None: none
    # configured.
    first_rollout_share: float | None = None


@dataclass(frozen=True)
class ProbedPrompt:
    """One of a model learner's training prompts, as the client sent it (``messages``,
    without the harness the gateway adds), its ``target`` reply, whether the trainer's
    greedy answer to it was the target after training (``trained``), and the target's
    length in tokens: what the worker asks the candidate through the gateway before the
    gate (``reef.learning.skew``)."""

    messages: list[dict[str, Any]]
    target: str
    trained: bool
    target_tokens: int


@dataclass(frozen=True)
class LearnerOutput:
    """A learner's result: new components (digests in the artifact store; None leaves
    the head's component), the record ids it actually used, and its metrics. A model
    learner whose trainer measured its fit may add ``probe``: a sample of its training
    prompts for the train/serve skew check. ``routing`` replaces the manifest's routing
    component (``distill``: the student's first share of the traffic)."""

    adapter: str | None = None
    harness: str | None = None
    checkpoint: str | None = None
    routing: RoutingComponent | None = None
    consumed: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    probe: tuple[ProbedPrompt, ...] = ()


class Learner(ABC):
    """A way to turn experience into a candidate component.

    Built-ins and plugins register in the ``reef.learners`` entry-point group under their
    ``type`` name. ``learn`` runs in the worker (a model learner starts its own child
    process for training); it raises ``ReefError`` subclasses for expected failures.
    """

    type_name: ClassVar[str]
    kind: ClassVar[Literal["harness", "model"]]
    config_model: ClassVar[type[LearnerConfig]]

    def __init__(self, config: LearnerConfig) -> None:
        if not isinstance(config, self.config_model):
            raise InvalidInputError(
                f"the {self.type_name} learner needs a {self.config_model.__name__}, "
                f"not a {type(config).__name__}"
            )
        self.config = config

    @abstractmethod
    def learn(self, context: LearnerContext) -> LearnerOutput:
        """Produce a component from ``context.batch.train`` (never from ``holdout``)."""
