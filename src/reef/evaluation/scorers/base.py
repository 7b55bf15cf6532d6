"""The scorer contract and its registry: ``Scorer``, its settings (``ScorerConfig``) and
context (``ScorerContext``), and ``ScorerRegistry``, which finds a scorer by its
``type:`` name in the ``reef.scorers`` entry-point group (the package docstring says
how to write one)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from reef.core.errors import InvalidInputError
from reef.core.plugins import PluginRegistry
from reef.evaluation.values import EvalItem, Reply, ScoreResult

SCORER_GROUP = "reef.scorers"


class ConfiguredModel(Protocol):
    """A configured model that scorers may ask (the ``llm_judge``'s judge)."""

    def ask(
        self, messages: list[dict[str, Any]], upstream: str | None = None, model: str | None = None
    ) -> str:
        """The reply text of ``model`` on ``upstream`` (None: the scenario's own) to
        ``messages`` (OpenAI chat form). Whatever the call raises propagates."""


"""(chat messages, upstream name or None, model name or None) -> the reply's text."""


class ScorerError(InvalidInputError):
    """A scorer or an item is misconfigured (bad settings, no reference where one is
    needed, an invalid pattern or schema, no model for a judge). Never raised for a bad
    answer: that scores 0."""


class UnknownScorerError(ScorerError):
    """A spec names a scorer type that nothing registered."""


class ScorerConfig(BaseModel):
    """Base of a scorer's settings (the spec minus ``type``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class ScorerContext:
    """What the builder of scorers (the worker or the CLI) can lend them.

    ``model`` asks a configured model; None means no model is available to scorers.
    """

    model: ConfiguredModel | None = None


class Scorer(ABC):
    """Scores one answer against one item.

    Built-ins and plugins register in the ``reef.scorers`` entry-point group under their
    ``type_name``. ``config`` is an instance of ``config_model`` (the registry validates
    the spec's settings with it).
    """

    type_name: ClassVar[str]
    config_model: ClassVar[type[ScorerConfig]]

    def __init__(self, config: ScorerConfig, context: ScorerContext) -> None:
        """Keep ``config`` and ``context``; raises ``ScorerError`` when ``config`` is not
        an instance of ``config_model``."""
        if not isinstance(config, self.config_model):
            raise ScorerError(
                f"scorer {self.type_name!r} needs a {self.config_model.__name__}, "
                f"got {type(config).__name__}"
            )
        self.config = config
        self.context = context

    def score_reply(self, reply: Reply, item: EvalItem) -> ScoreResult:
        """Score a whole reply (its text, content and tool calls). The default scores
        ``reply.text`` with ``score``; scorers of tool calls override this."""
        return self.score(reply.text, item)

    @abstractmethod
    def score(self, output: str, item: EvalItem) -> ScoreResult:
        """Score ``output`` (an arm's reply to ``item``).

        Always returns a score in [0, 1]; an answer it cannot parse scores 0 with
        ``details`` saying why. Raises ``ScorerError`` only when the scorer or the item
        is misconfigured (e.g. a regex scorer with no pattern anywhere).
        """


class ScorerRegistry(PluginRegistry[Scorer, ScorerConfig]):
    """Scorer classes by type name: the ``reef.scorers`` entry points, plus (or instead
    of) ``classes`` given here, which win over entry points of the same name. Entry
    points are loaded only when their type is used. ``config`` validates settings
    without building the scorer, so no model is needed."""

    group = SCORER_GROUP
    kind = "scorer"
    base = Scorer
    unknown_error = UnknownScorerError
    settings_error = ScorerError

    def build(
        self,
        spec: Mapping[str, Any] | str,
        where: str,
        context: ScorerContext | None = None,
    ) -> Scorer:
        """A scorer from ``spec`` (``{"type": name, ...settings}`` or a bare type name)
        with ``context`` (default: no model). Raises ``ScorerError`` for a spec without
        a string ``type``, ``UnknownScorerError`` for an unregistered type, and
        ``ScorerError`` for bad settings or a scorer that cannot work here."""
        type_name, settings = self.spec_settings(spec, where, names_allowed=True)
        config = self.config(type_name, settings, where)
        return self.get(type_name)(config, context or ScorerContext())


def build_scorer(
    spec: Mapping[str, Any] | str,
    context: ScorerContext | None = None,
    registry: ScorerRegistry | None = None,
    where: str = "scorer",
) -> Scorer:
    """``ScorerRegistry.build`` on ``registry`` (default: the entry points)."""
    return (registry or ScorerRegistry()).build(spec, where, context)
