"""Evaluation: suites, scorers, paired comparison, gate decisions, canary.

Owns: eval suites (file suites, regression suites, safety probes — ``suites``,
``safety``), scorers (``scorers``: ``Scorer`` plugins in the ``reef.scorers``
entry-point group; the built-ins in ``scorers.builtin`` and ``scorers.tools``), the
paired runner that asks a candidate and the head the same items through a gateway
(``runner``), the statistics and the decision rule (``stats``, ``decision``), the gate
that evaluates a candidate and publishes it per the recipe's mode (``gate``), the
canary monitor (``canary_monitor``), the evaluations store (``results``) and human
reports (``report``).
Does not own: serving and canary traffic splitting (``gateway``; never imported here),
learning and experience selection (``learning`` builds the holdout items and calls the
gate), the release chain itself (``releases``).
Extend: a scorer subclasses ``reef.evaluation.Scorer`` and registers in the
``reef.scorers`` entry-point group; recipes pick it by ``type:``.
"""

# The face: what other packages import (tests/architecture checks that nothing else is).
from reef.evaluation.canary_monitor import (
    CanaryMonitor,
    CanaryOutcome,
)
from reef.evaluation.config import (
    GateConfig,
    GateRule,
)
from reef.evaluation.decision import (
    decide_results,
    score_answers,
)
from reef.evaluation.gate import (
    EvaluationFailedError,
    EvidenceSource,
    Gate,
    GateOutcome,
)
from reef.evaluation.judging import judge_arm_overlap
from reef.evaluation.report import (
    candidate_summary,
    write_report,
)
from reef.evaluation.results import (
    EvaluationStore,
    evaluation_holdings,
)
from reef.evaluation.runner import (
    EvalRunError,
    GatewayTarget,
    collect_answers,
    parse_reply,
)
from reef.evaluation.scorers import (
    SCORER_GROUP,
    ConfiguredModel,
    Scorer,
    ScorerConfig,
    ScorerContext,
    ScorerError,
    ScorerRegistry,
)
from reef.evaluation.scorers.builtin import (
    LlmJudgeConfig,
    LlmJudgeScorer,
    normalize_text,
)
from reef.evaluation.shadow import SHADOW_OF_TAG, shadow_budgets, shadow_progress, shadow_settings
from reef.evaluation.shadow_config import ShadowConfig, ShadowJudgeConfig
from reef.evaluation.suites import (
    load_suite,
)
from reef.evaluation.teacher_checks import CHECK_SOURCE, TeacherChecks, needs_check
from reef.evaluation.values import (
    TRANSIENT_ERROR_KINDS,
    EvalItem,
    EvidenceNotes,
    Provenance,
)

__all__ = [
    "CHECK_SOURCE",
    "SCORER_GROUP",
    "SHADOW_OF_TAG",
    "TRANSIENT_ERROR_KINDS",
    "CanaryMonitor",
    "CanaryOutcome",
    "ConfiguredModel",
    "EvalItem",
    "EvalRunError",
    "EvaluationFailedError",
    "EvaluationStore",
    "EvidenceNotes",
    "EvidenceSource",
    "Gate",
    "GateConfig",
    "GateOutcome",
    "GateRule",
    "GatewayTarget",
    "LlmJudgeConfig",
    "LlmJudgeScorer",
    "Provenance",
    "Scorer",
    "ScorerConfig",
    "ScorerContext",
    "ScorerError",
    "ScorerRegistry",
    "ShadowConfig",
    "ShadowJudgeConfig",
    "TeacherChecks",
    "candidate_summary",
    "collect_answers",
    "decide_results",
    "evaluation_holdings",
    "judge_arm_overlap",
    "load_suite",
    "needs_check",
    "normalize_text",
    "parse_reply",
    "score_answers",
    "shadow_budgets",
    "shadow_progress",
    "shadow_settings",
    "write_report",
]
