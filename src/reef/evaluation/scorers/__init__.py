"""Scorers: how one answer to one eval item becomes a score in [0, 1].

A scorer is a ``Scorer`` subclass with a pydantic ``config_model`` for its settings,
found by its ``type:`` name in the ``reef.scorers`` entry-point group. A gate (or an
item) names one by a spec: ``{"type": "regex", "pattern": "^yes"}`` or just
``"exact"``. The contract and the registry are in ``base``; the built-ins register in
``pyproject.toml`` exactly as a plugin would: text scorers in ``builtin`` (``exact``,
``normalized_exact``, ``contains``, ``regex``, ``json_schema``, ``numeric``,
``llm_judge``) and tool-call scorers in ``tools`` (``tool_call``, ``turn``). The
statistics that turn scores into a decision are not scorers: ``reef.evaluation.stats``.

Writing your own (a Python scorer class): subclass ``Scorer``, give it ``type_name``,
a ``config_model`` (a ``ScorerConfig`` subclass; ``extra="forbid"`` is inherited) and
``score``, then register it in your package's ``pyproject.toml``::

    [project.entry-points."reef.scorers"]
    sql_equivalent = "my_package.scorers:SqlEquivalentScorer"

or, embedded in an application or a test, pass ``ScorerRegistry(classes={...})``.
YAML only ever selects a registered ``type:``; it never names a ``module:callable`` to
import, so a config file cannot run arbitrary code.
"""

from reef.evaluation.scorers.base import (
    SCORER_GROUP,
    ConfiguredModel,
    Scorer,
    ScorerConfig,
    ScorerContext,
    ScorerError,
    ScorerRegistry,
    UnknownScorerError,
    build_scorer,
)

__all__ = [
    "SCORER_GROUP",
    "ConfiguredModel",
    "Scorer",
    "ScorerConfig",
    "ScorerContext",
    "ScorerError",
    "ScorerRegistry",
    "UnknownScorerError",
    "build_scorer",
]
