"""Learning: the worker, recipes, experience selection, and the learners.

Owns: ``reef worker`` (claiming jobs from ``reef.jobs``, running them, storing progress,
retrying only failures that can pass: ``learning.retries``),
recipes (trigger + selection + learners + gate settings, in YAML), selecting experience
for training (``select_experience``), harness learners (fewshot, instructions, skills)
and model learners (sft, preference, rl) and their trainers, trained as the candidate
will be served, and the train/serve skew check before the gate (``skew``). Every learner
produces a candidate on the release chain; it never publishes (the evaluation gate does).
Does not own: serving (``gateway``; never imported here), the SQL schema (``db``), the
chain and artifacts (``releases``), evaluation (``evaluation``).
Torch is imported only in ``learning/trainers`` and only inside the child process that
trains.
Extend: a learner subclasses ``reef.learning.Learner`` and registers in the
``reef.learners`` entry-point group (the built-ins register the same way); recipes pick
it by ``type:``.
"""

# The face: what other packages import (tests/architecture checks that nothing else is).
from reef.learning.base import (
    ExperienceBatch,
    Learner,
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    MetricLog,
    Metrics,
    Reflector,
    TrainingExample,
)
from reef.learning.computed import SignalPass, SignalWriter
from reef.learning.follow_ups import Reading, read_follow_up
from reef.learning.judges import JudgeConfig, JudgePass, JudgeWriter
from reef.learning.recipe_files import shadow_judge_problems
from reef.learning.recipes import (
    Recipe,
    RecipeError,
    load_recipe,
)
from reef.learning.reflect import UpstreamModels
from reef.learning.registry import (
    LEARNER_GROUP,
    LearnerRegistry,
)
from reef.learning.signals import ExtractorConfig, Signal, SignalsConfig, session_signals
from reef.learning.signals_preview import SignalPreview, preview_signals
from reef.learning.worker import (
    Worker,
)

__all__ = [
    "LEARNER_GROUP",
    "ExperienceBatch",
    "ExtractorConfig",
    "JudgeConfig",
    "JudgePass",
    "JudgeWriter",
    "Learner",
    "LearnerConfig",
    "LearnerContext",
    "LearnerOutput",
    "LearnerRegistry",
    "MetricLog",
    "Metrics",
    "Reading",
    "Recipe",
    "RecipeError",
    "Reflector",
    "Signal",
    "SignalPass",
    "SignalPreview",
    "SignalWriter",
    "SignalsConfig",
    "TrainingExample",
    "UpstreamModels",
    "Worker",
    "load_recipe",
    "preview_signals",
    "read_follow_up",
    "session_signals",
    "shadow_judge_problems",
]
